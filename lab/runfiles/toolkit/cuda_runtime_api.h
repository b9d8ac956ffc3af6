/* LAB-STANDIN header (gpufleet lab artifact, not NVIDIA software). */
#ifndef LAB_STANDIN_CUDA_RUNTIME_API_H
#define LAB_STANDIN_CUDA_RUNTIME_API_H
int cudaRuntimeGetVersion(int *runtimeVersion);
#endif
