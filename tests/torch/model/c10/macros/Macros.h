#pragma once
#ifndef C10_LIKELY
#define C10_LIKELY(x) __builtin_expect(!!(x), 1)
#endif
