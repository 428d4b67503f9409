/* STAND-IN for HAMi-core's libvgpu.so, built by the molecule `agent` scenario.
 * It only exports the CUDA driver API entry points the hami_core role checks for; it limits nothing and
 * must never be preloaded into a real workload. */
int cuInit(unsigned int flags) { (void)flags; return 0; }
int cuMemAlloc_v2(void **dptr, unsigned long bytesize) { (void)dptr; (void)bytesize; return 0; }
int cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
  (void)symbol; (void)pfn; (void)version; (void)flags; return 0;
}
