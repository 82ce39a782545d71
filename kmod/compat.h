/* SPDX-License-Identifier: GPL-2.0 */
/*
 * compat.h - what differs between the kernels the module is built for: Debian
 * 12's 6.1 (the guest the tests run) up to 6.12 (Debian 12's newer kernel, on
 * which tests/test_core_kbuild.py builds it when its headers are installed).
 * One helper per kernel interface that changed, with the version it changed in.
 */
#ifndef GPUSLICE_COMPAT_H
#define GPUSLICE_COMPAT_H

#include <linux/device.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/version.h>
#include <net/genetlink.h>

/* class_create() lost its owner argument in 6.4 */
static inline struct class *gs_class_create(const char *name)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	return class_create(name);
#else
	return class_create(THIS_MODULE, name);
#endif
}

/* notify_change() takes a mount's idmap, not a user namespace, from 6.3 */
static inline int gs_notify_change(struct dentry *dentry, struct iattr *attr)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	return notify_change(&nop_mnt_idmap, dentry, attr, NULL);
#else
	return notify_change(&init_user_ns, dentry, attr, NULL);
#endif
}

/* vma->vm_flags is written through vm_flags_mod() from 6.3 (mmap lock held) */
static inline void gs_vm_flags_mod(struct vm_area_struct *vma, vm_flags_t set,
				   vm_flags_t clear)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_mod(vma, set, clear);
#else
	vma->vm_flags = (vma->vm_flags | set) & ~clear;
#endif
}

/* a dump's parsed attributes moved into genl_dumpit_info.info in 6.6 */
static inline struct nlattr *gs_dump_attr(struct netlink_callback *cb, int type)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 6, 0)
	return genl_dumpit_info(cb)->info.attrs[type];
#else
	return genl_dumpit_info(cb)->attrs[type];
#endif
}

#endif /* GPUSLICE_COMPAT_H */
