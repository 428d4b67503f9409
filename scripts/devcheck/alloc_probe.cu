// alloc_probe: allocate N MiB of device memory in one cudaMalloc and say whether it worked.
//
//   alloc_probe MIB [HOLD_SECONDS]
//
// Prints one JSON line: {"mib": N, "ok": true|false, "error": "<cudaGetErrorName>", "pid": P} and, when
// the allocation worked, holds it for HOLD_SECONDS (default 0), or until its stdin closes, then frees it.
// Used by scripts/device_check.py under HAMi-core's libvgpu.so (LD_PRELOAD) with the env our Allocate gave:
// a 4096 MiB limit must let 3072 MiB through and refuse 6144 MiB with out-of-memory. Exit 0 when the
// allocation worked, 3 when CUDA refused it, 2 on a usage error, 4 when CUDA could not start.
#include <cuda_runtime.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: alloc_probe MIB [HOLD_SECONDS]\n");
        return 2;
    }
    long mib = strtol(argv[1], NULL, 10);
    int hold = argc > 2 ? atoi(argv[2]) : 0;
    if (mib <= 0) {
        fprintf(stderr, "alloc_probe: MIB must be > 0\n");
        return 2;
    }
    cudaError_t err = cudaFree(0);  // create the context first: its own memory is not the probe's
    if (err != cudaSuccess) {
        printf("{\"mib\": %ld, \"ok\": false, \"stage\": \"context\", \"error\": \"%s\", \"pid\": %d}\n", mib,
               cudaGetErrorName(err), (int)getpid());
        fflush(stdout);
        return 4;
    }
    void *ptr = NULL;
    err = cudaMalloc(&ptr, (size_t)mib << 20);
    if (err != cudaSuccess) {
        printf("{\"mib\": %ld, \"ok\": false, \"stage\": \"cudaMalloc\", \"error\": \"%s\", \"pid\": %d}\n", mib,
               cudaGetErrorName(err), (int)getpid());
        fflush(stdout);
        return 3;
    }
    cudaMemset(ptr, 0, (size_t)mib << 20);  // touch it: the memory is really in use
    cudaDeviceSynchronize();
    printf("{\"mib\": %ld, \"ok\": true, \"stage\": \"cudaMalloc\", \"error\": null, \"pid\": %d}\n", mib,
           (int)getpid());
    fflush(stdout);
    time_t end = time(NULL) + hold;
    while (time(NULL) < end) {
        struct pollfd p = {0, POLLIN, 0};
        if (poll(&p, 1, 200) > 0) {
            char buf[64];
            if (read(0, buf, sizeof buf) <= 0) break;  // stdin closed: the check is done with us
        }
    }
    cudaFree(ptr);
    return 0;
}
