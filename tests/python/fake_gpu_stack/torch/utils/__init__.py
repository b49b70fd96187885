"""The fake torch's utils package: only cpp_extension (load_inline) is there."""
