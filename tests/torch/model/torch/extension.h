// A model of PyTorch's <torch/extension.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <c10/core/Allocator.h>
#include <string>
#define TORCH_EXTENSION_NAME gpumem_torch_model
// pybind11's module: definitions are taken and dropped.
struct model_module {
  template <typename Function, typename... Extra> model_module &def(const char *, Function &&, Extra &&...) { return *this; }
};
#define PYBIND11_MODULE(name, variable) void pybind_init_##name(model_module &variable)
