// What the C++ autograd nodes (autograd.h) share: each is a torch::autograd::Node subclass recorded the way
// PyTorch's own generated operators record theirs (functions/utils.h: next edges, set_history, SavedVariable),
// not a torch::autograd::Function: its CppNode machinery (context, saved-data map, input / output info) cost
// 18 us of host time per forward + backward of a tiny product on the CPU (docs/perf_notes.md, "Host time").
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <initializer_list>
#include <memory>

namespace semiring_ops {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// Whether a backward records a graph of its own: create_graph=True (grad mode on inside the backward) and some
// tensor it reads needs a gradient. Its gradient must then be built from differentiable operators.
inline bool records_graph(std::initializer_list<at::Tensor> tensors) {
  if (!c10::GradMode::is_enabled()) return false;
  for (const at::Tensor& t : tensors)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

// Forward-mode AD has no formula here: a dual tensor is refused, not silently given no tangent.
inline void check_no_forward_ad(const char* op, std::initializer_list<at::Tensor> tensors) {
  for (const at::Tensor& t : tensors)
    TORCH_CHECK(!t._fw_grad(/*level=*/0).defined(), op, ": forward-mode automatic differentiation (a dual tensor) ",
                "is not supported; use reverse mode (backward, torch.autograd.grad)");
}

// Owning pointers to nodes: std::shared_ptr up to torch 2.12, c10::intrusive_ptr since (Edge::function's type).
using NodePtr = decltype(torch::autograd::Edge::function);

template <class N, class Ptr = NodePtr> struct NodeMaker;
template <class N> struct NodeMaker<N, c10::intrusive_ptr<torch::autograd::Node>> {
  static c10::intrusive_ptr<N> make() { return c10::make_intrusive<N>(); }
};
template <class N> struct NodeMaker<N, std::shared_ptr<torch::autograd::Node>> {
  // deleteNode frees a long chain of nodes without deep recursion; named through the dependent argument, so that it
  // is looked up only where this specialisation is used (torch < 2.13, which declares it)
  static void destroy(N* node) { deleteNode(node); }  // found by ADL (Node's namespace)
  static std::shared_ptr<N> make() { return std::shared_ptr<N>(new N(), &destroy); }
};

// A new node of type N whose next edges are `inputs`' gradient edges (invalid for one that needs no gradient).
template <class N, class... Inputs> auto new_node(const Inputs&... inputs) {
  auto node = NodeMaker<N>::make();
  node->set_next_edges(torch::autograd::collect_next_edges(inputs...));
  return node;
}

}  // namespace semiring_ops
