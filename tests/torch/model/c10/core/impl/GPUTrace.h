// A model of PyTorch's <c10/core/impl/GPUTrace.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <c10/core/impl/PyInterpreter.h>
namespace c10::impl { struct GPUTrace { static const PyInterpreter *get_trace(); }; }
