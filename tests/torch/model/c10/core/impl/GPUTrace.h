#pragma once
#include <c10/core/impl/PyInterpreter.h>
namespace c10::impl { struct GPUTrace { static const PyInterpreter *get_trace(); }; }
