{
  "targets": [
    {
      "target_name": "sapipe",
      "sources": [
        "native/addon/addon.cpp",
        "native/addon/comm_local_binding.cpp",
        "native/addon/comm_ucx_binding.cpp",
        "native/addon/device/cuda_binding.cpp",
        "native/addon/device/cuda_buffer.cpp",
        "native/addon/errors.cpp",
        "native/addon/js_args.cpp",
        "native/addon/kernels_binding.cpp",
        "native/addon/native_buffer.cpp",
        "native/addon/device/comm_nccl_binding.cpp",
        "native/addon/nn_binding.cpp",
        "native/addon/queue.cpp",
        "native/addon/update_binding.cpp",
        "native/comm/local/local_group.cpp",
        "native/comm/local/local_ops.cpp",
        "native/comm/local/local_registry.cpp",
        "native/comm/direct.cpp",
        "native/comm/ring.cpp",
        "native/comm/nccl/nccl_ops.cpp",
        "native/comm/nccl/nccl_watchdog.cpp",
        "native/comm/ucx/shared_regions.cpp",
        "native/comm/ucx/ucx_group.cpp",
        "native/core/aligned_buffer.cpp",
        "native/core/cpu_clock.cpp",
        "native/core/device/cuda_plugin.cpp",
        "native/core/device/device_memory.cpp",
        "native/core/execution_queue.cpp",
        "native/core/latch.cpp",
        "native/core/plugin_loader.cpp",
        "native/core/queued_update.cpp",
        "native/core/status.cpp",
        "native/core/thread_pool.cpp",
        "native/cpu/cpu_api.cpp",
        "native/cpu/gemm.cpp",
        "native/cpu/kernel_table.cpp",
        "native/cpu/nn_ops.cpp",
        "native/cpu/simd.cpp",
        "native/cpu/topk.cpp",
        "native/core/update_plan.cpp"
      ],
      "include_dirs": [
        "<!(node -p \"require('node-addon-api').include_dir\")",
        "native/include"
      ],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS", "NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS"],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions", "-std=gnu++17"],
      "cflags_cc": ["-std=c++17", "-fexceptions", "-O3", "-fno-math-errno", "-fvisibility=hidden", "-Wall", "-Wextra"],
      "ldflags": ["-pthread"],
      "libraries": ["-ldl"]
    }
  ]
}
