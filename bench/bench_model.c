/* dsv4 bench model: checkpoint loading.
 *   1. a V4-Flash-shaped checkpoint (69,187 tensors, 160 GB of file holes): parse the header and
 *      bind every weight view: ms, tensors/s, header MB/s next to the read bandwidth;
 *   2. a real ~256 MB checkpoint: open in place (memory-mapped, nothing copied) vs a copying loader
 *      (read() of every file into memory), then one pass over the mapped weights (page cache hot)
 *      in GB/s next to the read bandwidth. */
#include "bench.h"
#include "dsv4.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void rm_flat_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

static double open_ms(const char *dir, int reps, int64_t *tensors)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        dsv4_model *m = NULL;
        double t0 = bench_now();
        if (dsv4_model_open(dir, NULL, &m) != DSV4_OK) {
            fprintf(stderr, "bench model: %s\n", dsv4_last_error());
            exit(1);
        }
        double dt = bench_now() - t0;
        *tensors = dsv4_checkpoint_count(dsv4_model_get_checkpoint(m));
        dsv4_model_close(m);
        if (dt < best) best = dt;
    }
    return best * 1e3;
}

/* The copying peer: read every file of the directory into one malloc'd buffer each. */
static double copy_load_ms(const char *dir, double *bytes)
{
    double t0 = bench_now();
    DIR *d = opendir(dir);
    struct dirent *e;
    *bytes = 0;
    while (d && (e = readdir(d))) {
        if (!strstr(e->d_name, ".safetensors")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        int fd = open(p, O_RDONLY);
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb) != 0) continue;
        char *buf = malloc((size_t)sb.st_size);
        size_t got = 0;
        while (buf && got < (size_t)sb.st_size) {
            ssize_t n = read(fd, buf + got, (size_t)sb.st_size - got);
            if (n <= 0) break;
            got += (size_t)n;
        }
        *bytes += (double)got;
        free(buf);
        close(fd);
    }
    if (d) closedir(d);
    return (bench_now() - t0) * 1e3;
}

/* One pass over every mapped tensor (64-bit sums), OpenMP over fixed tensor ranges. */
static double stream_gbs(const dsv4_checkpoint *ck, int threads, double *bytes_out)
{
    int64_t n = dsv4_checkpoint_count(ck);
    double bytes = 0, best = 1e30;
    volatile uint64_t sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        uint64_t total = 0;
        double t0 = bench_now();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) reduction(+ : total)
        for (int64_t i = 0; i < n; i++) {
            dsv4_tensor_entry e;
            if (dsv4_checkpoint_entry(ck, i, &e) != DSV4_OK) continue;
            const uint8_t *p = e.data;
            uint64_t s = 0, k = 0;
            for (; k + 8 <= e.nbytes; k += 8) {
                uint64_t v;
                memcpy(&v, p + k, 8);
                s += v;
            }
            for (; k < e.nbytes; k++) s += p[k];
            total += s;
        }
        double dt = bench_now() - t0;
        sink += total;
        if (dt < best) best = dt;
    }
    for (int64_t i = 0; i < n; i++) {
        dsv4_tensor_entry e;
        if (dsv4_checkpoint_entry(ck, i, &e) == DSV4_OK) bytes += (double)e.nbytes;
    }
    (void)sink;
    *bytes_out = bytes;
    return bytes / best / 1e9;
}

int dsv4_bench_model(int argc, char **argv)
{
    int threads = bench_opt_int(argc, argv, "--threads", dsv4_default_threads());
    int quick = bench_opt_flag(argc, argv, "--quick");
    const char *tmp = bench_opt_str(argc, argv, "--dir", "/tmp");
    double bw = bench_read_bandwidth(quick ? ((size_t)256 << 20) : ((size_t)1 << 30), threads, 3);
    printf("dsv4 bench model — %d thread(s)\nmemory read bandwidth (measured now): %.1f GB/s\n\n", threads, bw);

    char dir[512];
    snprintf(dir, sizeof dir, "%s/dsv4-bench-model-%d", tmp, (int)getpid());
    /* 1. V4-Flash shapes, headers only */
    dsv4_model_config c;
    dsv4_config_default(&c);
    dsv4_write_options o = {1, 1, DSV4_LAYOUT_OFFICIAL, 1, 1};
    double t0 = bench_now();
    if (dsv4_checkpoint_write(dir, &c, &o) != DSV4_OK) {
        fprintf(stderr, "bench model: %s\n", dsv4_last_error());
        rm_flat_dir(dir);
        return 1;
    }
    double write_ms = (bench_now() - t0) * 1e3;
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "rb");
    uint8_t len8[8] = {0};
    if (!f || fread(len8, 1, 8, f) != 8) {
        fprintf(stderr, "bench model: cannot read %s\n", path);
        return 1;
    }
    fclose(f);
    double hbytes = 0;
    for (int k = 7; k >= 0; k--) hbytes = hbytes * 256 + len8[k];
    int64_t tensors = 0;
    double ms = open_ms(dir, quick ? 2 : 5, &tensors);
    printf("V4-Flash-shaped checkpoint (file holes; written in %.0f ms): %lld tensors, %.1f MB header\n", write_ms,
           (long long)tensors, hbytes / 1e6);
    printf("  open + bind every view: %.1f ms = %.2f M tensors/s; header parsed at %.0f MB/s = %.2f%% of read bandwidth\n\n",
           ms, (double)tensors / ms / 1e3, hbytes / ms / 1e3, 100.0 * hbytes / (ms * 1e-3) / (bw * 1e9));
    rm_flat_dir(dir);

    /* 2. a real checkpoint: FP8 weights, FP4 experts */
    dsv4_config_tiny(&c);
    c.dim = 1024;
    c.q_lora_rank = 256;
    c.n_heads = 8;
    c.o_lora_rank = 128;
    c.vocab_size = 8192;
    c.n_routed_experts = quick ? 8 : 32;
    c.moe_inter_dim = 1024;
    dsv4_write_options o2 = {1, 2, DSV4_LAYOUT_OFFICIAL, 1, 0};
    t0 = bench_now();
    if (dsv4_checkpoint_write(dir, &c, &o2) != DSV4_OK) {
        fprintf(stderr, "bench model: %s\n", dsv4_last_error());
        rm_flat_dir(dir);
        return 1;
    }
    write_ms = (bench_now() - t0) * 1e3;
    double copied = 0, copy_ms = copy_load_ms(dir, &copied); /* also warms the page cache */
    copy_ms = copy_load_ms(dir, &copied);
    ms = open_ms(dir, quick ? 2 : 5, &tensors);
    dsv4_model *m = NULL;
    if (dsv4_model_open(dir, NULL, &m) != DSV4_OK) {
        fprintf(stderr, "bench model: %s\n", dsv4_last_error());
        return 1;
    }
    double wbytes = 0, gbs = stream_gbs(dsv4_model_get_checkpoint(m), threads, &wbytes);
    dsv4_model_close(m);
    printf("real checkpoint (hidden 1024, %lld experts x 5 blocks; written in %.0f ms = %.0f MB/s): %lld tensors, %.0f MB\n",
           (long long)c.n_routed_experts, write_ms, copied / write_ms / 1e3, (long long)tensors, wbytes / 1e6);
    printf("  open in place (mmap, 0 bytes copied): %.2f ms;  copying loader (read() into memory): %.1f ms = %.1f GB/s;"
           "  in-place is %.0fx faster\n",
           ms, copy_ms, copied / copy_ms / 1e6, copy_ms / ms);
    printf("  one pass over the mapped weights: %.1f GB/s = %.0f%% of read bandwidth\n", gbs, 100.0 * gbs / bw);
    rm_flat_dir(dir);
    return 0;
}
