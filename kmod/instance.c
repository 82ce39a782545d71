// SPDX-License-Identifier: GPL-2.0
/*
 * instance.c - gpuslice instances and their nodes.
 *
 * Every node is a struct device of class "gpuslice" named
 * "gpuslice!<name>!<leaf>", which devtmpfs creates as
 * /dev/gpuslice/<name>/<leaf> with the owner and mode the device type's
 * devnode() callback gives. All nodes share one cdev over a dynamic major;
 * open() finds the node by minor in gs_minors.
 *
 * An instance cannot be destroyed while any of its nodes is open (-EBUSY):
 * RM objects live in the real files the open nodes hold, and the decision core
 * must outlive them. The module cannot be unloaded while a node is open
 * (gs_fops.owner = THIS_MODULE). Destroying unlists the instance and removes
 * its nodes under gs_instances_lock (gs_node_open() looks minors up under it);
 * the rest goes with the last reference (netlink handlers hold one while they
 * read an instance without that lock).
 */
#include <linux/cdev.h>
#include <linux/ctype.h>
#include <linux/device.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/module.h>
#include <linux/mount.h>
#include <linux/namei.h>
#include <linux/slab.h>
#include <linux/xarray.h>

#include "compat.h"
#include "driver.h"
#include "fops.h"
#include "inject.h"
#include "instance.h"
#include "netlink.h"
#include "reaper.h"

DEFINE_MUTEX(gs_instances_lock);
LIST_HEAD(gs_instances);

static DEFINE_XARRAY(gs_minors);
static DEFINE_IDA(gs_minor_ida);
static DEFINE_IDA(gs_id_ida);
static dev_t gs_devt;
static struct cdev gs_cdev;
static struct class *gs_class;

/* device_type.devnode() takes a const device from 6.2 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 2, 0)
static char *gs_node_devnode(const struct device *dev, umode_t *mode, kuid_t *uid,
			     kgid_t *gid)
#else
static char *gs_node_devnode(struct device *dev, umode_t *mode, kuid_t *uid,
			     kgid_t *gid)
#endif
{
	struct gs_node *node = container_of(dev, struct gs_node, dev);

	if (mode)
		*mode = node->inst->mode;
	if (uid)
		*uid = node->inst->uid;
	if (gid)
		*gid = node->inst->gid;
	return NULL;	/* the name, with '!' turned into '/' */
}

static const struct device_type gs_node_type = {
	.name = "gpuslice_node",
	.devnode = gs_node_devnode,
};

static void gs_node_release(struct device *dev)
{
	struct gs_node *node = container_of(dev, struct gs_node, dev);

	ida_free(&gs_minor_ida, MINOR(dev->devt));
	kfree(node);
}

static void gs_node_leaf(const struct gs_node *node, char *buf, size_t len)
{
	switch (node->kind) {
	case GS_FILE_CTL:
		strscpy(buf, "nvidiactl", len);
		break;
	case GS_FILE_GPU:
		snprintf(buf, len, "nvidia%u", node->gpu);
		break;
	case GS_FILE_UVM:
		strscpy(buf, "nvidia-uvm", len);
		break;
	}
}

static struct gs_node *gs_node_create(struct gs_instance *inst,
				      enum gs_file_kind kind, u32 gpu)
{
	struct gs_node *node;
	char leaf[16];
	int minor;
	int err;

	node = kzalloc(sizeof(*node), GFP_KERNEL);
	if (!node)
		return ERR_PTR(-ENOMEM);
	minor = ida_alloc_max(&gs_minor_ida, GS_NR_MINORS - 1, GFP_KERNEL);
	if (minor < 0) {
		kfree(node);
		return ERR_PTR(minor);
	}
	node->inst = inst;
	node->kind = kind;
	node->gpu = gpu;
	device_initialize(&node->dev);
	node->dev.devt = MKDEV(MAJOR(gs_devt), minor);
	node->dev.class = gs_class;
	node->dev.type = &gs_node_type;
	node->dev.release = gs_node_release;
	gs_node_leaf(node, leaf, sizeof(leaf));
	err = dev_set_name(&node->dev, "gpuslice!%s!%s", inst->name, leaf);
	if (err)
		goto err_put;
	err = xa_err(xa_store(&gs_minors, minor, node, GFP_KERNEL));
	if (err)
		goto err_put;
	err = device_add(&node->dev);
	if (err)
		goto err_erase;
	return node;

err_erase:
	xa_erase(&gs_minors, minor);
err_put:
	put_device(&node->dev);	/* frees the minor and the node */
	return ERR_PTR(err);
}

static void gs_node_destroy(struct gs_node *node)
{
	xa_erase(&gs_minors, MINOR(node->dev.devt));
	device_del(&node->dev);
	put_device(&node->dev);
}

/* Applies the instance's owner and mode to an existing devtmpfs node. */
static int gs_node_chattr(struct gs_node *node)
{
	struct gs_instance *inst = node->inst;
	struct iattr attr = {
		.ia_valid = ATTR_UID | ATTR_GID | ATTR_MODE,
		.ia_uid = inst->uid,
		.ia_gid = inst->gid,
		.ia_mode = S_IFCHR | (inst->mode ? inst->mode : 0600),
	};
	struct inode *inode;
	struct path path;
	char leaf[16];
	char *name;
	int err;

	gs_node_leaf(node, leaf, sizeof(leaf));
	name = kasprintf(GFP_KERNEL, "/dev/" GPUSLICE_DEV_DIR "/%s/%s", inst->name, leaf);
	if (!name)
		return -ENOMEM;
	err = kern_path(name, 0, &path);
	kfree(name);
	if (err)
		return err;
	inode = d_inode(path.dentry);
	err = -ENODEV;
	if (inode->i_rdev != node->dev.devt)
		goto out;
	err = mnt_want_write(path.mnt);
	if (err)
		goto out;
	inode_lock(inode);
	err = gs_notify_change(path.dentry, &attr);
	inode_unlock(inode);
	mnt_drop_write(path.mnt);
out:
	path_put(&path);
	return err;
}

bool gs_instance_name_valid(const char *name)
{
	size_t i, len = strnlen(name, GPUSLICE_NAME_MAX);

	if (len == 0 || len >= GPUSLICE_NAME_MAX)
		return false;
	if (!strcmp(name, ".") || !strcmp(name, ".."))
		return false;
	for (i = 0; i < len; i++) {
		unsigned char c = name[i];

		/* ASCII only: the kernel's isalnum() takes Latin-1 letters too */
		if (c >= 0x80 || (!isalnum(c) && c != '_' && c != '.' && c != '-'))
			return false;
	}
	return true;
}

struct gs_instance *gs_instance_find(const char *name)
{
	struct gs_instance *inst;

	lockdep_assert_held(&gs_instances_lock);
	list_for_each_entry(inst, &gs_instances, list)
		if (!strcmp(inst->name, name))
			return inst;
	return NULL;
}

/* The core calls this in the context of the call that caused the event. */
static void gs_core_event(void *ctx, const struct gs_event *ev)
{
	struct gs_instance *inst = ctx;

	if (ev->type == GPUSLICE_EV_ALLOC_REFUSED) {
		spin_lock(&inst->refused_lock);
		inst->refused_tid = current->pid;
		inst->refused_size = ev->size;
		spin_unlock(&inst->refused_lock);
	}
	if (ev->type == GPUSLICE_EV_CHANNEL_NEW || ev->type == GPUSLICE_EV_CHANNEL_DEL)
		gs_activity_channels_changed(inst);
	gs_netlink_event(inst, ev);
}

u64 gs_refused_size(struct gs_instance *inst)
{
	u64 size = 0;

	spin_lock(&inst->refused_lock);
	if (inst->refused_tid == current->pid) {
		size = inst->refused_size;
		inst->refused_tid = 0;
	}
	spin_unlock(&inst->refused_lock);
	return size;
}

void gs_instance_hold(struct gs_instance *inst)
{
	lockdep_assert_held(&gs_instances_lock);
	kref_get(&inst->ref);
}

struct gs_instance *gs_instance_get(const char *name)
{
	struct gs_instance *inst;

	mutex_lock(&gs_instances_lock);
	inst = gs_instance_find(name);
	if (inst)
		gs_instance_hold(inst);
	mutex_unlock(&gs_instances_lock);
	return inst;
}

/* Removes the nodes (and their minors, so open() cannot find them), in reverse. */
static void gs_instance_unpublish(struct gs_instance *inst)
{
	lockdep_assert_held(&gs_instances_lock);
	inst->live = false;
	while (inst->nr_nodes)
		gs_node_destroy(inst->nodes[--inst->nr_nodes]);
}

static void gs_instance_release(struct kref *ref)
{
	struct gs_instance *inst = container_of(ref, struct gs_instance, ref);
	struct gs_proc *proc, *tmp;

	WARN_ON_ONCE(inst->nr_nodes);
	gs_reaper_teardown(&inst->reaper);	/* its item may still be running */
	gs_activity_free(inst);	/* its work item reads the core */
	if (inst->core)
		gs_inst_free(inst->core);
	list_for_each_entry_safe(proc, tmp, &inst->procs, list)
		kfree(proc);
	mutex_destroy(&inst->procs_lock);
	mutex_destroy(&inst->cfg_lock);
	if (inst->id)
		ida_free(&gs_id_ida, inst->id);
	kfree(inst);
}

void gs_instance_put(struct gs_instance *inst)
{
	kref_put(&inst->ref, gs_instance_release);
}

static int gs_instance_add_node(struct gs_instance *inst, enum gs_file_kind kind, u32 gpu)
{
	struct gs_node *node;

	node = gs_node_create(inst, kind, gpu);
	if (IS_ERR(node))
		return PTR_ERR(node);
	inst->nodes[inst->nr_nodes++] = node;
	return 0;
}

/* per-GPU limits only for the instance's GPUs (gpu_mask is fixed at creation) */
static bool gs_gpu_limits_valid(const struct gs_inst_cfg *cfg, u32 gpu_mask)
{
	unsigned int gpu;

	if (!(cfg->set & GS_CFG_GPU_MEM_LIMIT))
		return true;
	for (gpu = 0; gpu < GS_MAX_GPUS; gpu++)
		if (cfg->gpu_mem_limit[gpu] && !(gpu_mask & BIT(gpu)))
			return false;
	return true;
}

int gs_instance_new(const struct gs_inst_cfg *cfg)
{
	u32 gpu_ids[GPUSLICE_MAX_GPUS] = { 0 };
	struct gs_instance *inst;
	unsigned long mask;
	unsigned int gpu;
	int err;

	if (!gs_instance_name_valid(cfg->name) || !cfg->gpu_mask || !cfg->mem_limit ||
	    !gs_gpu_limits_valid(cfg, cfg->gpu_mask))
		return -EINVAL;
	mask = cfg->gpu_mask;
	for_each_set_bit(gpu, &mask, GS_MAX_GPUS) {
		if (!gs_driver_has_gpu(gpu))
			return -ENODEV;
		gpu_ids[gpu] = gs_driver_gpu_id(gpu);
	}

	inst = kzalloc(sizeof(*inst), GFP_KERNEL);
	if (!inst)
		return -ENOMEM;
	kref_init(&inst->ref);
	strscpy(inst->name, cfg->name, sizeof(inst->name));
	mutex_init(&inst->procs_lock);
	mutex_init(&inst->cfg_lock);
	gs_gate_init(&inst->gate);
	INIT_LIST_HEAD(&inst->procs);
	gs_reaper_setup(&inst->reaper);
	spin_lock_init(&inst->refused_lock);
	gs_nl_ratelimit_init(&inst->refusal_events);
	inst->gpu_mask = cfg->gpu_mask;
	inst->weight = cfg->set & GS_CFG_WEIGHT ? cfg->weight : 100;
	inst->share = cfg->set & GS_CFG_SHARE ? cfg->share : 0;
	inst->timeslice_us = cfg->set & GS_CFG_TIMESLICE ? cfg->timeslice_us : 0;
	if (cfg->set & GS_CFG_SAMPLE) {
		inst->sample_us = cfg->sample_us;
		inst->repeat_us = cfg->repeat_us;
	}
	inst->uid = make_kuid(&init_user_ns, cfg->set & GS_CFG_UID ? cfg->uid : 0);
	inst->gid = make_kgid(&init_user_ns, cfg->set & GS_CFG_GID ? cfg->gid : 0);
	inst->mode = cfg->set & GS_CFG_MODE ? cfg->mode : 0600;
	if (!uid_valid(inst->uid) || !gid_valid(inst->gid)) {
		err = -EINVAL;
		goto err_free;
	}

	err = ida_alloc_min(&gs_id_ida, 1, GFP_KERNEL);
	if (err < 0)
		goto err_free;
	inst->id = err;
	inst->core_ops.event = gs_core_event;
	inst->core_ops.ctx = inst;
	inst->core = gs_inst_new(cfg->mem_limit, &inst->core_ops);
	if (!inst->core) {
		err = -ENOMEM;
		goto err_free;
	}
	err = gs_activity_new(inst);
	if (err)
		goto err_free;
	if (gs_inject_test_escapes())
		gs_inst_set_flags(inst->core, GS_INST_ALLOW_TEST_ESCAPES);
	/* RM's device instances taken as the minors (kmod/uapi/gpuslice.h, GPU_MEM_LIMIT) */
	gs_inst_set_gpus(inst->core, cfg->gpu_mask);
	gs_inst_set_gpu_ids(inst->core, gpu_ids);
	if (cfg->set & GS_CFG_GPU_MEM_LIMIT)
		gs_inst_set_gpu_limits(inst->core, cfg->gpu_mem_limit);
	if (cfg->set & GS_CFG_CAPS)	/* else all (the core's default) */
		gs_inst_set_caps(inst->core, cfg->caps);

	mutex_lock(&gs_instances_lock);
	if (gs_instance_find(cfg->name)) {
		err = -EEXIST;
		goto err_unlock;
	}
	err = gs_instance_add_node(inst, GS_FILE_CTL, 0);
	if (err)
		goto err_unlock;
	for_each_set_bit(gpu, &mask, GS_MAX_GPUS) {
		err = gs_instance_add_node(inst, GS_FILE_GPU, gpu);
		if (err)
			goto err_unlock;
	}
	if (gs_driver_has_uvm()) {
		err = gs_instance_add_node(inst, GS_FILE_UVM, 0);
		if (err)
			goto err_unlock;
	}
	list_add_tail(&inst->list, &gs_instances);
	inst->live = true;
	mutex_unlock(&gs_instances_lock);
	return 0;

err_unlock:
	gs_instance_unpublish(inst);	/* the nodes made so far */
	mutex_unlock(&gs_instances_lock);
err_free:
	gs_instance_put(inst);
	return err;
}

int gs_instance_del(const char *name)
{
	struct gs_instance *inst;
	int err = 0;

	inst = gs_instance_get(name);
	if (!inst)
		return -ENOENT;
	/* its real files nobody holds any more go first: their nodes are closed then */
	gs_reaper_flush(&inst->reaper);
	mutex_lock(&gs_instances_lock);
	if (!inst->live) {
		err = -ENOENT;	/* deleted meanwhile */
		goto out;
	}
	if (inst->nr_open) {
		err = -EBUSY;
		goto out;
	}
	list_del(&inst->list);
	gs_instance_unpublish(inst);
	mutex_unlock(&gs_instances_lock);
	gs_instance_put(inst);	/* the list's */
	gs_instance_put(inst);
	return 0;

out:
	mutex_unlock(&gs_instances_lock);
	gs_instance_put(inst);
	return err;
}

int gs_instance_set(const struct gs_inst_cfg *cfg)
{
	kuid_t uid = make_kuid(&init_user_ns, cfg->uid);
	kgid_t gid = make_kgid(&init_user_ns, cfg->gid);
	struct gs_instance *inst;
	unsigned int i;
	int err = 0;

	if ((cfg->set & GS_CFG_UID && !uid_valid(uid)) ||
	    (cfg->set & GS_CFG_GID && !gid_valid(gid)) ||
	    (cfg->set & GS_CFG_MEM_LIMIT && !cfg->mem_limit))
		return -EINVAL;
	inst = gs_instance_get(cfg->name);
	if (!inst)
		return -ENOENT;
	if (!gs_gpu_limits_valid(cfg, inst->gpu_mask)) {
		gs_instance_put(inst);
		return -EINVAL;
	}
	mutex_lock(&inst->cfg_lock);
	/*
	 * A call may hold the core lock long: wait for it without
	 * gs_instances_lock. No handover runs (cfg_lock): inst->core stays.
	 */
	if (cfg->set & GS_CFG_MEM_LIMIT)
		gs_inst_set_limit(inst->core, cfg->mem_limit);
	if (cfg->set & GS_CFG_GPU_MEM_LIMIT)
		gs_inst_set_gpu_limits(inst->core, cfg->gpu_mem_limit);
	if (cfg->set & GS_CFG_CAPS)	/* for the calls to come; objects made stay */
		gs_inst_set_caps(inst->core, cfg->caps);
	mutex_lock(&gs_instances_lock);
	if (!inst->live) {
		err = -ENOENT;
		goto out;
	}
	if (cfg->set & GS_CFG_WEIGHT)
		inst->weight = cfg->weight;
	if (cfg->set & GS_CFG_SHARE)
		inst->share = cfg->share;
	if (cfg->set & GS_CFG_TIMESLICE && cfg->timeslice_us != inst->timeslice_us) {
		WRITE_ONCE(inst->timeslice_us, cfg->timeslice_us);
		atomic_inc(&inst->timeslice_gen);
	}
	if (cfg->set & GS_CFG_SAMPLE) {
		WRITE_ONCE(inst->sample_us, cfg->sample_us);
		WRITE_ONCE(inst->repeat_us, cfg->repeat_us);
	}
	if (cfg->set & (GS_CFG_UID | GS_CFG_GID | GS_CFG_MODE)) {
		if (cfg->set & GS_CFG_UID)
			inst->uid = uid;
		if (cfg->set & GS_CFG_GID)
			inst->gid = gid;
		if (cfg->set & GS_CFG_MODE)
			inst->mode = cfg->mode;
		for (i = 0; i < inst->nr_nodes; i++) {
			err = gs_node_chattr(inst->nodes[i]);
			if (err)
				pr_warn("gpuslice: %s: cannot update node owner/mode (%d)\n",
					inst->name, err);
		}
		err = 0;
	}
out:
	mutex_unlock(&gs_instances_lock);
	mutex_unlock(&inst->cfg_lock);
	gs_instance_put(inst);
	return err;
}

/* how long a handover waits for the calls inside the gate before it gives up */
#define GS_HANDOVER_WAIT_MS	100

/*
 * The snapshot's buffer, sized before the gate closes (the size then may be
 * refused while calls are inside: a guess), grown inside if it must be.
 */
static void *gs_handover_buf(struct gs_inst *core, long *cap)
{
	long n = gs_snapshot_size(core);

	*cap = max(n, 0L) + (max(n, 0L) >> 2) + PAGE_SIZE;
	return gs_kvmalloc(*cap, GFP_KERNEL);
}

int gs_instance_handover(struct gs_instance *inst, struct gs_handover_stats *hs)
{
	struct gs_stats st;
	struct gs_inst *fresh;
	u64 t_close, t_drained;
	void *buf;
	long cap, len;
	int err;

	memset(hs, 0, sizeof(*hs));
	if (mutex_lock_killable(&inst->cfg_lock))
		return -EINTR;
	/* no other handover and no INSTANCE_SET from here: inst->core stays until the swap */
	gs_inst_stats(inst->core, &st);
	fresh = gs_inst_new(st.mem_limit, &inst->core_ops);	/* the snapshot gives the rest */
	if (!fresh) {
		err = -ENOMEM;
		goto out_unlock;
	}
	buf = gs_handover_buf(inst->core, &cap);
	if (!buf) {
		err = -ENOMEM;
		goto out_fresh;
	}

	t_close = ktime_get_ns();
	err = gs_gate_close(&inst->gate, msecs_to_jiffies(GS_HANDOVER_WAIT_MS));
	t_drained = ktime_get_ns();
	hs->drain_ns = t_drained - t_close;
	if (err)
		goto out_buf;
	len = gs_snapshot_size(inst->core);
	if (len > cap) {
		kvfree(buf);
		cap = len;
		buf = gs_kvmalloc(cap, GFP_KERNEL);
		if (!buf) {
			err = -ENOMEM;
			goto out_open;
		}
	}
	if (len >= 0)
		len = gs_snapshot_write(inst->core, buf, cap);
	if (len < 0) {
		err = len;
		goto out_open;
	}
	hs->bytes = len;
	gs_inject_snapshot(buf, len);	/* the test build's refused handover */
	err = gs_snapshot_read(fresh, buf, len);
	if (err)
		goto out_open;
	swap(inst->core, fresh);	/* fresh is the old core from here */

out_open:
	gs_gate_open(&inst->gate);
	hs->pause_ns = ktime_get_ns() - t_close;
	pr_debug("gpuslice: %s: handover %d: pause %llu ns (drain %llu ns), %llu bytes\n",
		 inst->name, err, hs->pause_ns, hs->drain_ns, hs->bytes);
out_buf:
	kvfree(buf);
out_fresh:
	gs_inst_free(fresh);	/* the old core, or the unused fresh one */
out_unlock:
	mutex_unlock(&inst->cfg_lock);
	return err;
}

struct gs_node *gs_node_open(unsigned int minor)
{
	struct gs_node *node;

	mutex_lock(&gs_instances_lock);
	node = xa_load(&gs_minors, minor);
	if (!node || !node->inst->live)
		node = ERR_PTR(-ENODEV);
	else
		node->inst->nr_open++;
	mutex_unlock(&gs_instances_lock);
	return node;
}

void gs_node_close(struct gs_node *node)
{
	mutex_lock(&gs_instances_lock);
	node->inst->nr_open--;
	mutex_unlock(&gs_instances_lock);
}

static void gs_proc_event(struct gs_instance *inst, u32 type, pid_t tgid)
{
	struct gs_event ev = {
		.type = type,
		.pid = tgid,
	};

	gs_netlink_event(inst, &ev);
}

void gs_proc_attach(struct gs_instance *inst, pid_t tgid)
{
	struct gs_proc *proc;
	bool first = false;

	mutex_lock(&inst->procs_lock);
	list_for_each_entry(proc, &inst->procs, list)
		if (proc->tgid == tgid)
			goto found;
	proc = gs_kzalloc(sizeof(*proc), GFP_KERNEL);
	if (!proc) {
		mutex_unlock(&inst->procs_lock);
		return;
	}
	proc->tgid = tgid;
	list_add_tail(&proc->list, &inst->procs);
	first = true;
found:
	proc->nr_open++;
	mutex_unlock(&inst->procs_lock);
	if (first)
		gs_proc_event(inst, GPUSLICE_EV_PROC_ATTACH, tgid);
}

void gs_proc_detach(struct gs_instance *inst, pid_t tgid)
{
	struct gs_proc *proc;
	bool last = false;

	mutex_lock(&inst->procs_lock);
	list_for_each_entry(proc, &inst->procs, list) {
		if (proc->tgid != tgid)
			continue;
		if (!--proc->nr_open) {
			list_del(&proc->list);
			kfree(proc);
			last = true;
		}
		break;
	}
	mutex_unlock(&inst->procs_lock);
	if (last)
		gs_proc_event(inst, GPUSLICE_EV_PROC_DETACH, tgid);
}

int gs_instances_init(void)
{
	int err;

	err = alloc_chrdev_region(&gs_devt, 0, GS_NR_MINORS, "gpuslice");
	if (err)
		return err;
	gs_class = gs_class_create("gpuslice");
	if (IS_ERR(gs_class)) {
		err = PTR_ERR(gs_class);
		goto err_region;
	}
	cdev_init(&gs_cdev, &gs_fops);
	gs_cdev.owner = THIS_MODULE;
	err = cdev_add(&gs_cdev, gs_devt, GS_NR_MINORS);
	if (err)
		goto err_class;
	return 0;

err_class:
	class_destroy(gs_class);
err_region:
	unregister_chrdev_region(gs_devt, GS_NR_MINORS);
	return err;
}

void gs_instances_exit(void)
{
	struct gs_instance *inst, *tmp;
	LIST_HEAD(gone);

	/* No node is open: each open file holds a reference on this module. */
	mutex_lock(&gs_instances_lock);
	list_for_each_entry_safe(inst, tmp, &gs_instances, list) {
		list_move_tail(&inst->list, &gone);
		gs_instance_unpublish(inst);
	}
	mutex_unlock(&gs_instances_lock);
	/* the release waits for the reaper's item, which takes gs_instances_lock */
	list_for_each_entry_safe(inst, tmp, &gone, list) {
		list_del(&inst->list);
		gs_instance_put(inst);
	}
	cdev_del(&gs_cdev);
	class_destroy(gs_class);
	unregister_chrdev_region(gs_devt, GS_NR_MINORS);
}
