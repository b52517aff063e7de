// The host-side entry points that every backend (csrc/cpu, csrc/cuda) implements, with one meaning.
// Python (semiring_ops/ops) validates user input before calling these; the TORCH_CHECKs in the backends
// are a second line that turns any mistake into an exception instead of a crash.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "sequence_problems.h"

namespace semiring_ops {

// Semiring batched matmul, forward.
//   a: (B, n, k), b: (B, k, m), one floating dtype (float16, bfloat16, float32, float64), one device;
//   any strides (a batch stride of 0 is a broadcast operand and is never copied B times).
//   semiring_id: the kId of a struct in semiring.h.
// Returns {out, arg}:
//   out (B, n, m), contiguous, in the accumulation dtype (float32 for 16-bit inputs, else the input's);
//   arg (B, n, m) int64, the k selected by max / min (lowest k on ties, first NaN wins), when with_arg
//   and the semiring selects; otherwise an empty int64 tensor.
// k = 0 gives the semiring's zero everywhere (and arg 0).
std::vector<at::Tensor> bmm_forward(const at::Tensor& a, const at::Tensor& b, int64_t semiring_id,
                                    bool with_arg);

// The log-weighted contraction that all log-semiring gradients are made of:
//   out[p, r, s] = sum_t L1[p, r, t] * R1[p, t, s] * exp(L0[p, r, t] + R0[p, t, s] + O0[p, r, s])
//   L0, L1: (B, R, T); R0, R1: (B, T, S); O0: (B, R, S); L1 and R1 optional (absent = 1).
//   One dtype, float32 or float64; any strides (batch stride 0 allowed). Returns (B, R, S) contiguous.
// T = 0 gives zeros.
at::Tensor log_contract(const at::Tensor& l0, const std::optional<at::Tensor>& l1, const at::Tensor& r0,
                        const std::optional<at::Tensor>& r1, const at::Tensor& o0);

// Both gradients of c = logbmm(a, b) given dL/dc = g:
//   grad_a[p, i, k] = sum_j w,  grad_b[p, k, j] = sum_i w,  w = g[p, i, j] * exp(a[p, i, k] + b[p, k, j] - c[p, i, j])
//   a: (B, n, k), b: (B, k, m), c and g: (B, n, m); one dtype, float32 or float64; any strides. A cell whose c
//   is -inf weighs 0. Returns {grad_a (B, n, k), grad_b (B, k, m)}, contiguous; one not needed is an empty
//   tensor. The CPU computes each cell's exponential once for both; the CUDA backend runs two log_contracts.
std::vector<at::Tensor> log_bmm_grads(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                                      const at::Tensor& g, bool need_a, bool need_b);

// One direction of the linear-chain recursion, for a batch of chains whose potentials factor into
// emissions and one shared transition matrix (a CRF, an HMM), in one kernel launch per direction:
//   emissions (B, T, C), transitions (C, C) [from, to], start (C), end (C): one dtype (float32 or
//   float64), one device, any strides; lengths (B,) int64 in 0..T on the same device.
// Forward (reverse = false), in the semiring S of semiring_id:
//   scores[b, 0, j] = start[j] (x) em[b, 0, j]
//   scores[b, t, j] = ((+)_i scores[b, t-1, i] (x) trans[i, j]) (x) em[b, t, j]        t = 1 .. L-1
//   total[b]        = (+)_j scores[b, L-1, j] (x) end[j]
// Reverse:
//   scores[b, L-1, i] = end[i]
//   scores[b, t, i]   = (+)_j trans[i, j] (x) em[b, t+1, j] (x) scores[b, t+1, j]          t = L-2 .. 0
//   total[b]          = (+)_i start[i] (x) em[b, 0, i] (x) scores[b, 0, i]
// with L = lengths[b]; scores past L are the semiring's zero, and total is its one when L = 0.
// lengths[b] = kInvalidLength (-1) marks a sequence that sequence_lengths found bad without raising (or any
// length outside 0..T): its total is NaN (and every other output of the ops below: llh NaN, tags -1, g_em NaN).
// Returns {total (B,), scores (B, T, C) contiguous, or an empty tensor unless save_scores}.
std::vector<at::Tensor> chain_scan(const at::Tensor& emissions, const at::Tensor& transitions,
                                   const at::Tensor& start, const at::Tensor& end, const at::Tensor& lengths,
                                   int64_t semiring_id, bool reverse, bool save_scores);

// The best path of each chain under a selecting semiring (max: Viterbi; min), arguments as chain_scan:
// the forward recursion keeping back-pointers (lowest index on ties), then the backtrack, on the device.
// Returns {score (B,) = the forward total, tags (B, T) int64, -1 past each length}.
std::vector<at::Tensor> chain_viterbi(const at::Tensor& emissions, const at::Tensor& transitions,
                                      const at::Tensor& start, const at::Tensor& end, const at::Tensor& lengths,
                                      int64_t semiring_id);

// The gradient of sum_b grad[b] * log_z[b] for log_z, alpha = chain_scan's forward log-semiring total and
// scores (arguments as chain_scan, plus alpha (B, T, C), log_z (B,), grad (B,), any stride: 0 broadcasts
// one value), computed during one reverse scan: with beta the reverse scores and
// P = exp(alpha + beta - log_z) the marginals,
//   g_em (B, T, C) = grad * P,   g_start (C) = sum_b g_em[b, 0],   g_end (C) = sum_b g_em[b, L-1],
//   g_trans (C, C) = sum_{b, t} grad_b exp(alpha[b,t,i] + trans[i,j] + em[b,t+1,j] + beta[b,t+1,j] - log_z_b).
// With tags (B, T) int64 (in 0..C-1 below each length, any strides), the gradient of
// sum_b grad[b] * (gold[b] - log_z[b]) instead, gold[b] the log-semiring score of the path tags[b] (a CRF's
// log-likelihood, crf_log_likelihood): grad * (Y - P) with Y[b, t, c] = [tags[b, t] == c] in g_em, and the
// gold transitions' counts minus the pair marginals in g_trans.
// A chain whose log_z or gold score is -inf gets zero gradient.
// Returns {g_em, g_trans, g_start, g_end, beta, weight}. When the pair marginals do not fit on chip (large C on the
// GPU), g_trans holds only the gold transitions' counts (zeros without tags), and beta (B, T, C) (the reverse
// scores) and weight (B,) (the weight each chain's gradient got: grad, or 0 where the gold path is impossible) come
// back for the caller to add the pair marginals' sum, one log_contract over (b, t) in the bmm family
// (semiring_ops/ops/chain_ops.py, pair_marginal_sum); otherwise beta and weight are empty.
std::vector<at::Tensor> chain_log_backward(const at::Tensor& emissions, const at::Tensor& transitions,
                                           const at::Tensor& start, const at::Tensor& end, const at::Tensor& lengths,
                                           const at::Tensor& alpha, const at::Tensor& log_z, const at::Tensor& grad,
                                           const std::optional<at::Tensor>& tags);

// A linear-chain CRF's log-likelihood of given tag paths, in one forward scan (arguments as chain_scan with
// the log semiring, plus tags (B, T) int64 in 0..C-1 below each length, any strides):
//   llh[b] = gold[b] - log_z[b],  gold[b] = start[y_0] + sum_{t<L} em[b, t, y_t] + sum_{0<t<L} trans[y_{t-1}, y_t]
//            + end[y_{L-1}]  (y = tags[b]);  0 for L = 0, -inf where gold is -inf (a forbidden path).
// Returns {llh (B,), alpha (B, T, C) the forward scores, log_z (B,)}; chain_log_backward with the same tags
// gives its gradient.
std::vector<at::Tensor> crf_log_likelihood(const at::Tensor& emissions, const at::Tensor& transitions,
                                           const at::Tensor& start, const at::Tensor& end, const at::Tensor& lengths,
                                           const at::Tensor& tags);

// The lengths of a batch of right-padded sequences, validated in one device round trip:
//   mask (B, T) bool or uint8, a prefix mask, or lengths (B,) of an integer dtype (at most one; neither: all
//   T); tags (B, T) of an integer dtype, optional, each in 0..num_tags-1 below its sequence's length.
// Returns lengths (B,) int64 on the inputs' device (never the caller's lengths tensor when it writes them).
// With raise_errors it throws ValueError saying which argument is bad when the mask has holes (a 1 after a
// 0), a length lies outside 0..T, or a tag is out of range; on a GPU that costs one synchronisation. Without
// raise_errors, and always while the current CUDA stream is capturing a graph (no synchronisation allowed),
// it throws nothing: each bad sequence's length comes back as kInvalidLength, and the chain ops give that
// sequence NaN. The shape and dtype checks throw either way.
at::Tensor sequence_lengths(const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& lengths,
                            const std::optional<at::Tensor>& tags, int64_t batch, int64_t steps, int64_t num_tags,
                            bool raise_errors);

// The log-semiring batched matmul's fast mode (CUDA only, compute capability 8.0+; not in the CPU build):
//   out[p,i,j] = logsumexp_k a[p,i,k] + b[p,k,j]  on tensor cores (TF32 products of per-k-tile scaled
//   exponentials, combined with a running maximum; csrc/cuda/log_bmm_fast_kernels.cu has the math).
//   a: (B, n, k), b: (B, k, m), one dtype (float32, float16, bfloat16), one CUDA device; any strides (an
//   operand whose inner stride is not 1, or whose row / batch strides or data are not 4-element aligned, is
//   copied; a batch stride of 0 stays a broadcast). passes: 1 (TF32, |error| <= ~1e-3) or 3 (3xTF32, ~1e-6).
// Returns {out, flags, count}:
//   out (B, n, m) float32 contiguous; flags (B, n, m) uint8, 1 where out is NOT trusted (its scaled sum fell
//   below 2^-64, or its row / column holds NaN, +inf or |x| > 2^125): out is NaN there and the caller must
//   recompute those outputs exactly; count (1,) int64, the number of flags set.
// k = 0 gives -inf everywhere and no flags.
std::vector<at::Tensor> log_bmm_fast(const at::Tensor& a, const at::Tensor& b, int64_t passes);

// The fast log's scaled tier, fused around its cuBLAS product (CUDA only; semiring_ops/ops/fast_log_scaled.py has
// the math; csrc/cuda/fast_log_scaled_kernels.cu the kernels). Two calls, the product between them:
//   log_bmm_fast_scales(a (B, n, k), b (B, k, m)), one dtype (float32, float16, bfloat16), any strides ->
//     {fa (B, n, k), fb (B, k, m): the factors 2^(x log2 e - top) in float32; row_top (B, n), row_state (B, n)
//     uint8, col_top (B, m), col_state (B, m)}: each row's of a and column's of b maximum times log2 e, and its
//     state (1: the maximum is -inf; 2: NaN, +inf or beyond 2^125; the scale is 0 for both).
//   log_bmm_fast_finish(sums (B, n, m) float32 contiguous: fa fb in TF32, and the four scale tensors) -> {flags
//     (B, n, m) bool, count (a 0-d int64)}; sums becomes log(sum) + (row_top + col_top) ln 2, flagged where it
//     must be recomputed exactly (sum below 2^-64 unless a state is 1, or a state is 2).
std::vector<at::Tensor> log_bmm_fast_scales(const at::Tensor& a, const at::Tensor& b);
std::vector<at::Tensor> log_bmm_fast_finish(at::Tensor& sums, const at::Tensor& row_top, const at::Tensor& row_state,
                                            const at::Tensor& col_top, const at::Tensor& col_state);

// The select kernel: max-plus / min-plus without an index, float32 and packed 16-bit (CUDA only, compute capability
// 8.0+; the packed family, csrc/cuda/packed_select_kernels.cu), which semiring_ops/build/backends.py takes instead
// of bmm_forward for float32 / float16 / bfloat16 max / min without an index when it fills the GPU; callable
// directly at any size (tests): a (B, n, k), b (B, k, m) of one of those dtypes -> out (B, n, m) float32 holding
// the correctly rounded values, in a's dtype, of max_k (min_k) a[p,i,k] + b[p,k,j].
at::Tensor bmm_packed_select(const at::Tensor& a, const at::Tensor& b, bool is_max);

// The HMM E-step in scaled probability space (CPU only; its own family, csrc/cpu/hmm_scaled_cpu.cpp), the compiled
// form of semiring_ops/hmm/scaling.py: log_emissions (B, T, C), log_trans (C, C) [from, to], log_start (C,), one
// dtype (float32 or float64), any strides; lengths (B,) int64 in 0..T. One pass per sequence, sequences in
// parallel; a sequence the scaled recursions cannot vouch for (scaling.py's underflow rule), and every sequence when a
// start or transition probability is 0, is done in log space. Returns {log_likelihood (B,), posteriors (B, T, C) (0 past each length), transitions (C, C) and starts
// (C,), the expected counts summed over the sequences not suspect, suspect (B,) bool}: suspect only where the
// log-likelihood is not finite (zero probability, NaN), which the caller recomputes on the log chain.
std::vector<at::Tensor> hmm_scaled_estep(const at::Tensor& log_emissions, const at::Tensor& log_trans,
                                         const at::Tensor& log_start, const at::Tensor& lengths);

// Gaussian log-densities (CPU only; the hmm family, csrc/cpu/hmm_emissions_cpu.cpp), for HMM emissions: x (N, D),
// means (C, D), factors (C, D) (diagonal) or (C, D, D), offsets (C,), one dtype (float32 or float64), D <= 32 ->
// out (N, C) = offsets[c] - 0.5 |F_c (x_n - means_c)|^2 (F_c diagonal or dense: the whitening of state c's precision,
// F_c^T F_c = precision; offsets hold the normalising constants).
at::Tensor hmm_gaussian_log_prob(const at::Tensor& x, const at::Tensor& means, const at::Tensor& factors,
                                 const at::Tensor& offsets);

// The M-step of categorical distributions under Dirichlet priors (CPU only; the hmm family,
// csrc/cpu/hmm_mstep_cpu.cpp): counts, concentration_minus_one and previous (..., K) of one shape and dtype (float32
// or float64) -> (..., K) log normalise(max(concentration - 1 + counts, 0)) per row, entries whose previous is -inf
// zeroed first when keep_zeros; a row whose total is not > 0 keeps previous (semiring_ops/hmm/emissions/base.py).
at::Tensor hmm_dirichlet_map(const at::Tensor& counts, const at::Tensor& concentration_minus_one,
                             const at::Tensor& previous, bool keep_zeros);

// Host memory only (the CPU extension): a block rows [r0, r0 + rows) x cols [c0, c0 + cols) of a symmetric
// (n, n[, D]) output, values (rows, cols[, D]) contiguous, written into out, the contiguous condensed vector
// of the pairs i < j (i <= j with diagonal) in scipy.spatial.distance.pdist's order: cell (i, j) of the block
// goes to position row_start(i) + j - i - (diagonal ? 0 : 1) when j >= i + (diagonal ? 0 : 1), and the
// block's cells on the other side of the diagonal are not written. One memcpy per row, rows in parallel.
void condensed_scatter(at::Tensor& out, const at::Tensor& values, int64_t n, int64_t r0, int64_t c0, bool diagonal);

// Host memory only (the CPU extension): dst = src, the block engine's dense write of a downloaded chunk into
// its place out[r0:r1, c0:c1] of a row-major output (semiring_ops/blocks/writers.py).
//   src: a contiguous CPU tensor; dst: a CPU tensor of src's shape and dtype (any dtype: bytes are copied)
//   that is a block of rows: dims 1.. dense row-major (each dst[i] contiguous) with any row stride
//   dst.stride(0) >= a row's elements, e.g. the (rows, cols[, D]) view of an (m, n[, D]) output; a dst of at
//   most one dim must be contiguous; an empty dst may have any strides (nothing is written). dst and src must
//   not overlap in memory.
// Pieces of 256 KiB of src in parallel (at::parallel_for, torch's thread count); a copy of at least 1 MiB
// uses non-temporal (streaming) stores where the build has AVX2 / AVX-512 (csrc/cpu/stream_store.h): the
// destination is not read into the cache first, which on a many-core host writes memory faster than a
// cached copy, and leaves dst out of the caches. Smaller copies, and builds without AVX2, are memcpy.
// Anything else (another device, dtype or shape, a non-contiguous src, a dst that is not a block of rows,
// overlapping memory) raises, naming the argument; callers fall back to dst.copy_(src) for other layouts.
void stream_copy(at::Tensor& dst, const at::Tensor& src);

// The inside algorithm over spans of one structure, for a batch of items of lengths 1..N, in one launch
// (csrc/span_dp.h and chain_dp.h have the dynamic programs), in the semiring S of semiring_id (log, max or min):
//   structure 0 (Eisner's projective dependency trees): potentials (B, N, N) arc scores [head, modifier], the
//     root's arc into m on the diagonal; charts (B, 4, N + 1, N + 1) = C<-, C->, I<-, I-> by [start, end]
//     over positions 0 (the root) .. N; total = C->[0, L] (multiroot) or the one-root-child sum;
//   structure 1 (CKY's binary span trees): potentials (B, N, N) span scores [i, j] (labels already summed);
//     charts (B, 1, N, N); total = beta[0, L - 1];
//   structure 2 (semi-Markov segments): potentials (B, N - 1, D, C, C) edges [start, length, label, previous
//     label] (D >= 2); charts (B, 1, N, C) = beta[end, label]; total = (+)_c beta[L - 1, c];
//   structure 3 (linear chains, csrc/chain_dp.h): potentials (B, N - 1, C, C) edges [position, label, previous
//     label]; charts (B, 2, N, C) = alpha[position, label], then beta (log) or the selected previous labels
//     (max / min); total = (+)_c alpha[L - 1, c].
// potentials: float32 or float64, any strides; lengths (B,) int64 in 1..N on the same device (an item with a
// length outside that range gets a NaN total and a zero gradient). Chart entries the program does not reach
// (past an item's length, below the diagonal) are 0. Returns {total (B,), charts}.
std::vector<at::Tensor> span_inside(const at::Tensor& potentials, const at::Tensor& lengths, int64_t structure,
                                    int64_t semiring_id, bool multiroot);

// The gradient of sum_b grad[b] * total[b] with respect to the potentials (the marginals under log; the
// best structure's 0 / 1 parts under max / min), from span_inside's charts (arguments as span_inside, plus
// charts and grad (B,), any strides). Returns the potentials' shape, contiguous.
at::Tensor span_adjoint(const at::Tensor& potentials, const at::Tensor& lengths, int64_t structure,
                        int64_t semiring_id, bool multiroot, const at::Tensor& charts, const at::Tensor& grad);

// CTC (csrc/ctc_dp.h has the programs): log_probs (T, N, C) float32 or float64, any strides; targets (N, S) int64
// padded past target_lengths; input_lengths, target_lengths (N,) int64; all on one device; blank in [0, C).
// An item with a length or label out of range gets a NaN total (the Python layer checks them first).
// ctc_log: [log Z (N,), states]: with need_states, the (N, T, K = 2 S + 1) state occupancies at each item's frames
// (undefined past them and for an item with no path), what ctc_collect sums per label; else an empty tensor.
std::vector<at::Tensor> ctc_log(const at::Tensor& log_probs, const at::Tensor& targets, const at::Tensor& input_lengths,
                                const at::Tensor& target_lengths, int64_t blank, bool need_states);

// ctc_collect: (T, N, C) weight[n] * d log Z_n / d log_probs from ctc_log's total and states (the same other
// arguments): each frame's label posteriors times the item's weight, 0 * weight past an item's frames and for an
// item with no path; total and weight (N,) of log_probs' dtype.
at::Tensor ctc_collect(const at::Tensor& log_probs, const at::Tensor& targets, const at::Tensor& input_lengths,
                       const at::Tensor& target_lengths, int64_t blank, const at::Tensor& total,
                       const at::Tensor& states, const at::Tensor& weight);

// ctc_viterbi: [best score (N,), states (N, T) int64]: the best path's extended-target state at each frame (ties
// as torchaudio's forced_align), -1 past the item's frames and everywhere for an item with no path.
std::vector<at::Tensor> ctc_viterbi(const at::Tensor& log_probs, const at::Tensor& targets,
                                    const at::Tensor& input_lengths, const at::Tensor& target_lengths, int64_t blank);

// RNN-T's lattice (csrc/rnnt_dp.h has the program): potentials (B, T, U + 1, 2) float32 or float64 (each cell's
// blank and next-label potential, any strides), frames and labels (B,) int64 in [1, T] and [0, U], on one device
// (the Python layer checks the ranges). rnnt_lattice: [total (B,), posteriors]: the semiring sum over each item's
// paths (max: the best path's score) and, with need_posteriors, (B, T, U + 1, 2) d total / d potentials (log:
// each move's posterior; max: 1 on the best path's moves, a blank where it ties with the label; zero off the
// item's lattice and for an item with no path), else an empty tensor.
std::vector<at::Tensor> rnnt_lattice(const at::Tensor& potentials, const at::Tensor& frames, const at::Tensor& labels,
                                     bool max, bool need_posteriors);

}  // namespace semiring_ops
