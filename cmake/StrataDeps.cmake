# Every dependency is found on the system (Debian packages, see scripts/setup),
# never vendored. docs/DEPENDENCIES.md says why each one was chosen.
# STRATA_GPU_CHECK_ONLY builds just what bench/gpu_check.sh needs on a lent GPU
# machine, which has CUDA, CMake and ninja but none of the Debian packages
# (GoogleTest, CLI11 and nlohmann-json travel there as .debs; BLAS is optional).
find_package(Threads REQUIRED)
find_package(OpenBLAS CONFIG QUIET)
if(OpenBLAS_FOUND)
  add_library(strata::openblas INTERFACE IMPORTED)
  target_include_directories(strata::openblas SYSTEM INTERFACE ${OpenBLAS_INCLUDE_DIRS})
  target_link_libraries(strata::openblas INTERFACE ${OpenBLAS_LIBRARIES})
elseif(STRATA_ALL_DEPS AND NOT STRATA_GPU_CHECK_ONLY)
  message(FATAL_ERROR "OpenBLAS not found: run scripts/setup (Debian package libopenblas-dev)")
endif()
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
if(STRATA_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(STRATA_GPU_CHECK_ONLY)
  find_package(TBB QUIET)
  return()
endif()

find_package(PkgConfig REQUIRED)
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing>=2.2)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
find_package(TBB REQUIRED)
find_package(xsimd REQUIRED)
if(NOT STRATA_ALL_DEPS)
  # bench/gpu_check.sh's full build on the GPU machine: the engine, its tests
  # and benchmarks, from the packages it carries; the rest is optional.
  find_package(benchmark QUIET)
  return()
endif()
# The Python module is built for Debian's interpreter (python3-torch and
# python3-numpy live there), never for another python3 first on PATH.
if(NOT DEFINED Python_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python_EXECUTABLE /usr/bin/python3)
endif()
set(PYBIND11_FINDPYTHON ON)
find_package(pybind11 CONFIG REQUIRED)
if(STRATA_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
