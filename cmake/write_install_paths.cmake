# Run by `cmake --install` (install(SCRIPT) in CMakeLists.txt, after the GPUMEM_* variables are set):
# writes gpumem.pc and the Python package's _install_paths.py for the prefix being installed to.
# CMAKE_INSTALL_PREFIX here is the one in effect now (--prefix P overrides the configured one); DESTDIR,
# a staging root, is not part of the paths written.
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${GPUMEM_${kind}}")
    set(GPUMEM_FULL_${kind} "${GPUMEM_${kind}}")
    set(GPUMEM_PC_${kind} "${GPUMEM_${kind}}")
  else()
    set(GPUMEM_FULL_${kind} "${CMAKE_INSTALL_PREFIX}/${GPUMEM_${kind}}")
    set(GPUMEM_PC_${kind} "\${prefix}/${GPUMEM_${kind}}")
  endif()
endforeach()
set(GPUMEM_PREFIX "${CMAKE_INSTALL_PREFIX}")
set(GPUMEM_INSTALLED_LIBRARY "${GPUMEM_FULL_LIBDIR}/${GPUMEM_LIBRARY_NAME}")
configure_file("${GPUMEM_SOURCE_DIR}/cmake/gpumem.pc.in" "${GPUMEM_OUTPUT_DIR}/gpumem.pc" @ONLY)
configure_file("${GPUMEM_SOURCE_DIR}/cmake/install_paths.py.in" "${GPUMEM_OUTPUT_DIR}/_install_paths.py" @ONLY)
