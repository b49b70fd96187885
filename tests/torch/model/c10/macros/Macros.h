// A model of PyTorch's <c10/macros/Macros.h>: only what the torch adapter uses (README.md here).
#pragma once
#ifndef C10_LIKELY
#define C10_LIKELY(x) __builtin_expect(!!(x), 1)
#endif
