/* LAB-STANDIN: gpufleet's lab stand-in for NVIDIA's libnvfm.so.1 (not NVIDIA software): the fabric manager's
 * API library, which nothing in the lab calls; it exists so the archive's layout is the real one. */
const char *gpufleet_lab_standin_libnvfm(void) { return "LAB-STANDIN libnvfm " LAB_FM_VERSION; }
