# Host sanitizers (FLASHATTN_SANITIZE, e.g. "address,undefined") and libFuzzer instrumentation
# (FLASHATTN_BUILD_FUZZ) for the library, the tests and the fuzz target. Included by the top-level
# CMakeLists.txt before any target exists, so every C and C++ file is built the same way.
if(NOT FLASHATTN_SANITIZE)
  if(FLASHATTN_BUILD_FUZZ)
    message(FATAL_ERROR "FLASHATTN_BUILD_FUZZ needs FLASHATTN_SANITIZE (e.g. address,undefined)")
  endif()
  return()
endif()

add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${FLASHATTN_SANITIZE}>
                    $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer>
                    $<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=all>)
add_link_options(-fsanitize=${FLASHATTN_SANITIZE})

if(CMAKE_C_COMPILER_ID MATCHES "Clang" OR CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  if(NOT CMAKE_C_COMPILER_ID STREQUAL CMAKE_CXX_COMPILER_ID)
    message(FATAL_ERROR "FLASHATTN_SANITIZE: C compiler ${CMAKE_C_COMPILER_ID} and C++ compiler "
                        "${CMAKE_CXX_COMPILER_ID} differ; their sanitizer runtimes cannot be mixed")
  endif()
  # clang links its sanitizer runtime statically into executables only, so libflashattn.so keeps
  # undefined __asan_*/__ubsan_* references that the library's --no-undefined rejects. The shared
  # runtime resolves them in the library and the executables alike; the build tree's RPATH points
  # at it, since it lives in clang's private directory, not on the loader's path.
  add_link_options(-shared-libsan)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-runtime-dir
                  OUTPUT_VARIABLE flashattn_sanitizer_runtime_dir OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE flashattn_sanitizer_rc)
  if(NOT flashattn_sanitizer_rc EQUAL 0 OR NOT IS_DIRECTORY "${flashattn_sanitizer_runtime_dir}")
    message(FATAL_ERROR "FLASHATTN_SANITIZE: '${CMAKE_CXX_COMPILER} -print-runtime-dir' gave no "
                        "directory; install clang's runtime (Debian: libclang-rt-<version>-dev)")
  endif()
  list(APPEND CMAKE_BUILD_RPATH ${flashattn_sanitizer_runtime_dir})
  if(FLASHATTN_BUILD_FUZZ)
    # Coverage feedback from the library too, not only from the fuzz target's own file.
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>)
  endif()
elseif(FLASHATTN_BUILD_FUZZ)
  message(FATAL_ERROR "FLASHATTN_BUILD_FUZZ needs clang (libFuzzer): configure with CC=clang CXX=clang++")
endif()
