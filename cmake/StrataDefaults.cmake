# Compiler settings applied to every strata target (never to dependencies).
# Warnings are errors for our code; sanitizers are global when asked for so
# that every object, tests included, is instrumented alike.
if(STRATA_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
  # clang links its sanitizer runtime statically into executables and not
  # at all into shared libraries (libstrata.so, the Python module), so
  # every target takes the one shared runtime instead, found through an
  # rpath (it is not on the loader's path); GCC's is shared by default.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libclang_rt.asan-x86_64.so
                    OUTPUT_VARIABLE STRATA_ASAN_RUNTIME OUTPUT_STRIP_TRAILING_WHITESPACE)
    get_filename_component(asan_runtime_dir "${STRATA_ASAN_RUNTIME}" DIRECTORY)
    add_link_options(-shared-libsan -Wl,-rpath,${asan_runtime_dir})
  else()
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libasan.so
                    OUTPUT_VARIABLE STRATA_ASAN_RUNTIME OUTPUT_STRIP_TRAILING_WHITESPACE)
  endif()
endif()
# The fuzz targets: every object with libFuzzer's coverage hooks and ASan +
# UBSan; the targets themselves link libFuzzer's main (tests/fuzz).
if(STRATA_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "STRATA_FUZZ needs clang (libFuzzer): cmake --preset fuzz")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
if(STRATA_TSAN)
  if(STRATA_SANITIZE OR STRATA_FUZZ)
    message(FATAL_ERROR "STRATA_TSAN does not combine with AddressSanitizer (STRATA_SANITIZE, STRATA_FUZZ)")
  endif()
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()

# -Wno-restrict: GCC 12 reports false positives inside libstdc++'s
# std::string operator+ at -O2/-O3 (GCC bug 105329); clang has no such flag.
function(strata_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX,C>:-Wall -Wextra -Werror -Wshadow -Wno-missing-field-initializers>
    $<$<AND:$<COMPILE_LANGUAGE:CXX,C>,$<CXX_COMPILER_ID:GNU>>:-Wno-restrict>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)
endfunction()

# GCC 12's own avx512fintrin.h (_mm512_undefined_*) trips -W(maybe-)uninitialized
# when inlined into our code: the flags that quiet it, for the files built
# with -mavx512f (empty for other compilers).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  set(STRATA_AVX512_QUIET "-Wno-maybe-uninitialized;-Wno-uninitialized")
else()
  set(STRATA_AVX512_QUIET "")
endif()

# strata_library(name SOURCES ... LINKS ...): one layer = one target.
# Headers are included from the repository root ("engine/session.h"), but a
# layer's include path holds only its own directory and, through its
# links, those of the layers below it: each gets a directory of its own in
# the build tree holding one link, <layer> -> the source directory. So an
# include that crosses the layering fails to compile, not only to link.
function(strata_layer_includes target)
  file(RELATIVE_PATH layer ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  set(shim ${PROJECT_BINARY_DIR}/layers/${layer})
  get_filename_component(parent ${shim}/${layer} DIRECTORY)  # models/gpt: the link's parent, models/
  file(MAKE_DIRECTORY ${parent})
  file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR} ${shim}/${layer} SYMBOLIC)
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${shim}>)
endfunction()

function(strata_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_LINKS;PRIVATE_LINKS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  strata_layer_includes(${name})
  target_link_libraries(${name} PUBLIC ${ARG_PUBLIC_LINKS} PRIVATE ${ARG_PRIVATE_LINKS})
  strata_target_defaults(${name})
endfunction()
