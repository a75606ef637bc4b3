# The GPU rooms of the model, decode, dist and train layers (src/<layer>/cuda, src/dist/nccl).
# Each links its own layer and the GPU rooms below it; included when NSA_HAVE_CUDA.
set(nsa_cuda_flags $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)

# model/cuda: cuBLASLt GEMMs, one .cu per model op, the parameter state, ModelCuda, the kept
# model of the evaluations, logit rows, token losses, the step's phase timer.
add_library(nsa_model_cuda STATIC
  src/model/cuda/gemm.cpp
  src/model/cuda/gemv.cu
  src/model/cuda/skinny_gemm.cu
  src/model/cuda/embedding.cu
  src/model/cuda/rmsnorm.cu
  src/model/cuda/reductions.cu
  src/model/cuda/rope.cu
  src/model/cuda/gates.cu
  src/model/cuda/swiglu.cu
  src/model/cuda/decode_inputs.cu
  src/model/cuda/decode_projection.cu
  src/model/cuda/cross_entropy.cu
  src/model/cuda/add_into.cu
  src/model/cuda/finite_check.cu
  src/model/cuda/sel_distance_hist.cu
  src/model/cuda/phase_timer.cpp
  src/model/cuda/model_params_cuda.cpp
  src/model/cuda/model_cuda.cpp
  src/model/cuda/forward_model_cuda.cpp
  src/model/cuda/logit_rows_cuda.cpp
  src/model/cuda/token_losses_cuda.cpp)
target_link_libraries(nsa_model_cuda PUBLIC nsa_model nsa_kernels_cuda PRIVATE nsa_warnings)
target_compile_options(nsa_model_cuda PRIVATE ${nsa_cuda_flags})

# decode/cuda: the batched GPU decoder over the NSA decode kernels.
add_library(nsa_decode_cuda STATIC src/decode/cuda/model_decoder_cuda.cpp
                                   src/decode/cuda/model_decoder_prefill.cpp)
target_link_libraries(nsa_decode_cuda PUBLIC nsa_decode nsa_model_cuda PRIVATE nsa_warnings)

# train/cuda: the GPU optimizer (AdamW, ZeRO-1) and the GPU TrainModel.
add_library(nsa_train_cuda STATIC
  src/train/cuda/adamw_kernel.cu
  src/train/cuda/adamw_cuda.cpp
  src/train/cuda/train_model_cuda.cpp)
target_link_libraries(nsa_train_cuda PUBLIC nsa_train nsa_model_cuda PRIVATE nsa_warnings)
target_compile_options(nsa_train_cuda PRIVATE ${nsa_cuda_flags})

# dist/nccl (the CUDA toolkit's or the libnccl-dev package's NCCL): GPU-to-GPU gradient
# all-reduce. Without it, several GPU ranks reduce through host memory and the host communicator.
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
  add_library(nsa_dist_nccl STATIC src/dist/nccl/nccl_check.cpp src/dist/nccl/nccl_reducer.cpp)
  target_include_directories(nsa_dist_nccl SYSTEM PUBLIC ${NCCL_INCLUDE_DIR})
  target_link_libraries(nsa_dist_nccl PUBLIC nsa_dist nsa_kernels_cuda ${NCCL_LIBRARY}
                        PRIVATE nsa_warnings)
  target_link_libraries(nsa_train_cuda PUBLIC nsa_dist_nccl)
  target_compile_definitions(nsa_train_cuda PRIVATE NSA_HAVE_NCCL)
  set(NSA_HAVE_NCCL ON)
  message(STATUS "nsa: NCCL ${NCCL_LIBRARY}")
else()
  message(STATUS "nsa: NCCL not found: GPU ranks reduce through host memory")
endif()
