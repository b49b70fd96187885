// A model of PyTorch's <c10/util/Exception.h>: only what the torch adapter uses (README.md here).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
namespace c10 {
struct Error : std::runtime_error { using std::runtime_error::runtime_error; const char *what_without_backtrace() const noexcept { return what(); } };
struct OutOfMemoryError : Error { using Error::Error; };
template <typename... A> std::string str(A &&...a) { std::ostringstream o; (o << ... << a); return o.str(); }
inline std::string str() { return ""; }
}
#define TORCH_CHECK(cond, ...) do { if (!(cond)) throw ::c10::Error(::c10::str(__VA_ARGS__)); } while (0)
#define TORCH_CHECK_WITH(kind, cond, ...) do { if (!(cond)) throw ::c10::kind(::c10::str(__VA_ARGS__)); } while (0)
#define TORCH_WARN(...) (void)::c10::str(__VA_ARGS__)
#define TORCH_WARN_ONCE(...) (void)::c10::str(__VA_ARGS__)
#include <c10/macros/Macros.h>
