/* LAB-STANDIN: a tiny libcudart with the one entry point gpufleet's checks call (gpufleet lab artifact,
 * not NVIDIA software). It lets ldconfig and the loader find a real ELF library at the toolkit's path. */
#ifndef LAB_CUDART_VERSION
#error "build with -DLAB_CUDART_VERSION=<1000*major + 10*minor>"
#endif

__attribute__((visibility("default"))) int cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (!runtimeVersion) {
        return 1; /* cudaErrorInvalidValue */
    }
    *runtimeVersion = LAB_CUDART_VERSION;
    return 0;
}
