#pragma once
#include <c10/core/Allocator.h>
#include <string>
#define TORCH_EXTENSION_NAME gpumem_torch_stub
struct stub_module { template <typename F, typename... E> stub_module &def(const char *, F &&, E &&...) { return *this; } };
#define PYBIND11_MODULE(name, variable) static void pybind_init_##name(stub_module &variable); static void pybind_init_##name(stub_module &variable)
