/* STAND-IN for HAMi-core's libvgpu.so, for the SIMULATED sandbox only.
 *
 * The hami_core role checks that the artifact exports HAMi-core's CUDA driver API hooks (cuInit,
 * cuMemAlloc_v2) before installing it. The sandbox has no GPU and no CUDA, so this library exports those
 * symbols and does nothing; a real cluster installs the real libvgpu.so built from HAMi-core. */
int cuInit(unsigned int flags) { (void)flags; return 0; }
int cuMemAlloc_v2(void **ptr, unsigned long size) { (void)ptr; (void)size; return 2; /* OUT_OF_MEMORY */ }
const char *hami_sandbox_standin(void) { return "SIMULATED libvgpu.so stand-in (hami.node sandbox)"; }
