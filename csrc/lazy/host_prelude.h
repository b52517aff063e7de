// What every generated CPU kernel of the lazy reductions includes, first and alone, so that the compiler can
// take it precompiled (semiring_ops/lazy/host_compiler.py builds lazy/host_prelude.h.gch once per cache with the
// kernels' own flags): parsing these headers was about 0.4 s of each kernel's 0.9 s compile with g++ -O3.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "lazy/math.h"
#include "lazy/reducers.h"
#include "semiring.h"
