/* SPDX-License-Identifier: GPL-2.0 */
/*
 * shadow.h - the argument blocks the real driver reads, in pages of the
 * caller's address space that the caller cannot write (shadow.c).
 */
#ifndef GPUSLICE_SHADOW_H
#define GPUSLICE_SHADOW_H

#include <linux/types.h>

/* [GS_SHADOW_BASE, GS_SHADOW_END): below the default vm.mmap_min_addr (65536) */
#define GS_SHADOW_BASE		0x1000UL
#define GS_SHADOW_PAGES		15
#define GS_SHADOW_END		(GS_SHADOW_BASE + GS_SHADOW_PAGES * PAGE_SIZE)

struct gs_shadow;

/* A run of shadow pages that one call of one thread owns. */
struct gs_shadow_slot {
	struct gs_shadow *sh;
	unsigned int first;	/* page index in the shadow */
	unsigned int nr;	/* pages */
	void *kaddr;		/* the pages, as the kernel sees them */
	unsigned long uaddr;	/* the pages, as the driver reads them */
	int closes;		/* sh->closes when the slot was taken */
};

/*
 * Takes len bytes of the calling process's shadow (created at its first
 * call) for the calling thread: only this thread can write them through the
 * user mapping until gs_shadow_put(), which drops their user mappings again.
 * Sleeps (killable) while other threads of the process hold every page.
 * 0 or -errno.
 */
int gs_shadow_get(struct gs_shadow_slot *s, size_t len);
/* Gives the pages back; -EFAULT if the shadow was unmapped meanwhile. */
int gs_shadow_put(struct gs_shadow_slot *s);

int gs_shadow_init(void);
void gs_shadow_exit(void);

#endif /* GPUSLICE_SHADOW_H */
