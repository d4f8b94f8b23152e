# Install the built tree into a scratch prefix, then build and run the README's C example twice:
# once with `pkg-config --cflags --libs flashattn`, once through find_package(flashattn).
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# The C example is the first ```c block of README.md, so the README cannot drift from the API.
file(READ ${SOURCE_DIR}/README.md readme)
string(FIND "${readme}" "```c\n" start)
if(start EQUAL -1)
  message(FATAL_ERROR "README.md has no ```c block")
endif()
math(EXPR start "${start} + 5")
string(SUBSTRING "${readme}" ${start} -1 rest)
string(FIND "${rest}" "```" stop)
string(SUBSTRING "${rest}" 0 ${stop} example)
file(WRITE ${WORK_DIR}/readme_example.c "${example}")

# No RPATH may be left in installed files.
file(GLOB_RECURSE libs ${prefix}/lib*/libflashattn.so*)
foreach(lib ${libs})
  execute_process(COMMAND readelf -d ${lib} OUTPUT_VARIABLE dyn)
  if(dyn MATCHES "RPATH|RUNPATH")
    message(FATAL_ERROR "${lib} carries an RPATH/RUNPATH")
  endif()
endforeach()
file(GLOB_RECURSE pcs ${prefix}/*/flashattn.pc)
list(GET pcs 0 pc)
get_filename_component(pcdir ${pc} DIRECTORY)
get_filename_component(libdir ${pcdir} DIRECTORY)

set(ENV{PKG_CONFIG_PATH} ${pcdir})
execute_process(COMMAND pkg-config --cflags --libs flashattn OUTPUT_VARIABLE flags RESULT_VARIABLE rc
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config cannot find flashattn in ${pcdir}")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${C_COMPILER} -std=c11 -Wall -Wextra -Werror ${WORK_DIR}/readme_example.c ${flags} -o ${WORK_DIR}/via_pkgconfig)
set(ENV{LD_LIBRARY_PATH} ${libdir})
run(${WORK_DIR}/via_pkgconfig)

run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/abi/consumer -B ${WORK_DIR}/cmake-build -G ${CMAKE_GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DEXAMPLE_SOURCE=${WORK_DIR}/readme_example.c -DCMAKE_C_COMPILER=${C_COMPILER})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/cmake-build)
run(${WORK_DIR}/cmake-build/consumer)
