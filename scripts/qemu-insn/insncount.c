/*
 * A QEMU TCG plugin that counts the guest instructions a program executes: how
 * scripts/count-aarch64-insns.sh compares the aarch64 kernels without an Arm
 * machine (qemu's timing means nothing; its instruction counts are exact and
 * repeatable for one binary, input and environment).
 *
 * Self-contained: it declares below the few parts of qemu's plugin C API that
 * it uses, so it builds with plain gcc and no qemu source or header.
 *
 * Arguments (optional): mode=tb (default: one inline add per executed block;
 * exact for one thread), mode=insn (an add per instruction), mode=atomic (an
 * atomic add per block: exact with threads), out=FILE ("insns N"; else stderr).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

/*
 * The subset of the plugin API this file calls, as QEMU 7.2 defines it (what
 * Debian bookworm's qemu-user runs): plugin API version 1. qemu reads the
 * exported int qemu_plugin_version and refuses to load a plugin whose version
 * is outside the range it supports (0 to 1 for 7.2), so a qemu with another
 * API needs these declarations checked against its own header.
 */
#define QEMU_PLUGIN_EXPORT __attribute__((visibility("default")))
#define QEMU_PLUGIN_VERSION 1

typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t; /* only ever seen through a pointer */
struct qemu_plugin_tb;                  /* opaque: a block being translated */
struct qemu_plugin_insn;                /* opaque: one of its instructions */

enum qemu_plugin_cb_flags {
    QEMU_PLUGIN_CB_NO_REGS = 0,
    QEMU_PLUGIN_CB_R_REGS = 1,
    QEMU_PLUGIN_CB_RW_REGS = 2,
};

enum qemu_plugin_op {
    QEMU_PLUGIN_INLINE_ADD_U64 = 0,
};

typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index,
                                            void *userdata);
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id,
                                               struct qemu_plugin_tb *tb);

/* Provided by the qemu binary that loads the plugin. */
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id,
                                           qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id,
                                    qemu_plugin_udata_cb_t cb, void *userdata);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb,
                                          qemu_plugin_vcpu_udata_cb_t cb,
                                          enum qemu_plugin_cb_flags flags,
                                          void *userdata);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb,
                                              enum qemu_plugin_op op,
                                              void *ptr, uint64_t imm);
void qemu_plugin_register_vcpu_insn_exec_inline(struct qemu_plugin_insn *insn,
                                                enum qemu_plugin_op op,
                                                void *ptr, uint64_t imm);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb,
                                                 size_t idx);

/* Called by qemu: the plugin's entry point. */
QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id,
                                           const qemu_info_t *info,
                                           int argc, char **argv);

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

enum { MODE_TB, MODE_INSN, MODE_ATOMIC };
static int mode = MODE_TB;
static uint64_t count;          /* total executed guest instructions */
static char *out_path;

static void tb_exec_atomic(unsigned int vcpu_index, void *udata)
{
    (void)vcpu_index;
    __atomic_fetch_add(&count, (uint64_t)(uintptr_t)udata, __ATOMIC_RELAXED);
}

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    switch (mode) {
    case MODE_TB:
        qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64,
                                                 &count, n);
        break;
    case MODE_INSN:
        for (size_t i = 0; i < n; i++) {
            qemu_plugin_register_vcpu_insn_exec_inline(
                qemu_plugin_tb_get_insn(tb, i), QEMU_PLUGIN_INLINE_ADD_U64,
                &count, 1);
        }
        break;
    case MODE_ATOMIC:
        qemu_plugin_register_vcpu_tb_exec_cb(tb, tb_exec_atomic,
                                             QEMU_PLUGIN_CB_NO_REGS,
                                             (void *)(uintptr_t)n);
        break;
    }
}

static void at_exit(qemu_plugin_id_t id, void *p)
{
    (void)id;
    (void)p;
    uint64_t total = __atomic_load_n(&count, __ATOMIC_RELAXED);
    FILE *f = out_path ? fopen(out_path, "w") : stderr;
    if (!f) {
        f = stderr;
    }
    fprintf(f, "insns %llu\n", (unsigned long long)total);
    if (f != stderr) {
        fclose(f);
    }
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id,
                                           const qemu_info_t *info,
                                           int argc, char **argv)
{
    (void)info;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "mode=tb") == 0) {
            mode = MODE_TB;
        } else if (strcmp(argv[i], "mode=insn") == 0) {
            mode = MODE_INSN;
        } else if (strcmp(argv[i], "mode=atomic") == 0) {
            mode = MODE_ATOMIC;
        } else if (strncmp(argv[i], "out=", 4) == 0) {
            out_path = strdup(argv[i] + 4);
        } else {
            fprintf(stderr, "insncount: unknown argument %s\n", argv[i]);
            return -1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
    qemu_plugin_register_atexit_cb(id, at_exit, NULL);
    return 0;
}
