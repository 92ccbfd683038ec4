# The CUDA plugin target, shared by the main build (sapipe_cuda.so, the toolkit CMake finds) and
# the CUDA 11.8 sub-build (cmake/cuda11: sapipe_cuda11.so). The caller has enabled CUDA, found
# CUDAToolkit and set the target's architectures; `arch_names` ("sm_70 ... compute_90") is what
# `sapipe info` reports.
function(sapipe_add_cuda_plugin target source_dir architectures arch_names)
  add_library(${target} SHARED
    ${source_dir}/native/cuda/bench_update.cu
    ${source_dir}/native/cuda/bucket_update.cu
    ${source_dir}/native/cuda/device_errors.cpp
    ${source_dir}/native/cuda/device_runtime.cpp
    ${source_dir}/native/cuda/easgd.cu
    ${source_dir}/native/cuda/fused_update.cu
    ${source_dir}/native/cuda/nccl_entry.cpp
    ${source_dir}/native/core/device/nccl_loader.cpp
    ${source_dir}/native/core/device/cublas_loader.cpp
    ${source_dir}/native/core/device/dl_library.cpp
    ${source_dir}/native/cuda/nn_ops.cu
    ${source_dir}/native/cuda/plugin_entry.cpp
    ${source_dir}/native/cuda/reduce.cu
    ${source_dir}/native/cuda/topk.cu
    ${source_dir}/native/core/update_plan.cpp)
  set_target_properties(${target} PROPERTIES PREFIX "" CUDA_RUNTIME_LIBRARY Static
    CUDA_ARCHITECTURES "${architectures}" CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden)
  target_include_directories(${target} PRIVATE ${source_dir}/native/include)
  target_compile_definitions(${target} PRIVATE SAPIPE_CUDA_ARCHITECTURES="${arch_names}")
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-O3 -Wall -Wextra>
    $<$<COMPILE_LANGUAGE:CUDA>:-O3 -Xcompiler=-Wall,-Wextra --Werror=all-warnings>)
  # The runtime is linked statically and its symbols kept private: the plugin needs only the
  # driver (libcuda.so.1) at run time, and cannot clash with another cudart in the process (the
  # other plugin's included).
  find_package(Threads REQUIRED)
  target_link_libraries(${target} PRIVATE CUDA::cudart_static ${CMAKE_DL_LIBS} Threads::Threads
    -Wl,--exclude-libs,ALL -Wl,--no-undefined)
endfunction()

# "sm_75 sm_80 ... compute_120" from CMake's "75-real;80-real;...;120-virtual".
function(sapipe_cuda_arch_names out architectures)
  set(names "")
  foreach(arch ${architectures})
    string(REGEX REPLACE "^([0-9]+)-real$" "sm_\\1" arch "${arch}")
    string(REGEX REPLACE "^([0-9]+)-virtual$" "compute_\\1" arch "${arch}")
    string(REGEX REPLACE "^([0-9]+)$" "sm_\\1 compute_\\1" arch "${arch}")
    string(APPEND names " ${arch}")
  endforeach()
  string(STRIP "${names}" names)
  set(${out} "${names}" PARENT_SCOPE)
endfunction()
