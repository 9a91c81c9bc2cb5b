# CUDA is optional at configure time. STRATA_CUDA=AUTO builds the CUDA backend
# whenever nvcc is found; ON requires it; OFF never builds it.
# Architectures follow the toolkit: CUDA 13 dropped Volta (sm_70), so we build
# sm_75, sm_80 and sm_90 (+ compute_90 PTX for newer GPUs); a CUDA 12-or-older
# toolkit additionally builds sm_70 so V100 users can build.
set(STRATA_HAVE_CUDA OFF)
if(NOT STRATA_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      execute_process(COMMAND ${CMAKE_CUDA_COMPILER} --version OUTPUT_VARIABLE _nvcc_version)
      string(REGEX MATCH "release ([0-9]+)\\.([0-9]+)" _m "${_nvcc_version}")
      set(_cuda_major ${CMAKE_MATCH_1})
      if(_cuda_major AND _cuda_major LESS_EQUAL 12)
        set(CMAKE_CUDA_ARCHITECTURES "70-real;75-real;80-real;90")
      else()
        set(CMAKE_CUDA_ARCHITECTURES "75-real;80-real;90")
      endif()
    endif()
    enable_language(CUDA)
    # CUDA sources build as C++17: CMake 3.25 does not know nvcc's C++20
    # dialect, and headers shared with .cu files stay C++17-clean.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(STRATA_HAVE_CUDA ON)
    message(STATUS "strata: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
  elseif(STRATA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STRATA_CUDA=ON but no CUDA compiler (nvcc) was found; set CMAKE_CUDA_COMPILER or STRATA_CUDA=OFF")
  else()
    message(STATUS "strata: nvcc not found, building without the CUDA backend")
  endif()
endif()
