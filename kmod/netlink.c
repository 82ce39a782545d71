// SPDX-License-Identifier: GPL-2.0
/*
 * netlink.c - the "gpuslice" generic netlink family; the contract is
 * uapi/gpuslice.h. Every command, reads and dumps too, needs CAP_NET_ADMIN
 * (GENL_ADMIN_PERM) and CAP_SYS_ADMIN in the initial user namespace (checked
 * by gs_nl_admin()): replies and events name host pids and RM handles. Joining
 * the events group needs CAP_SYS_ADMIN where the kernel can say so. Attributes
 * are validated strictly against gs_nl_policy; values out of range are
 * refused with -EINVAL like malformed ones.
 */
#include <linux/capability.h>
#include <linux/kernel.h>
#include <linux/module.h>
#include <net/genetlink.h>

#include "core.h"
#include "instance.h"
#include "netlink.h"

static struct genl_family gs_genl_family;
static bool gs_genl_registered;

static const struct nla_policy gs_nl_policy[GPUSLICE_A_MAX + 1] = {
	[GPUSLICE_A_NAME]		= { .type = NLA_NUL_STRING, .len = GPUSLICE_NAME_MAX - 1 },
	[GPUSLICE_A_ID]			= { .type = NLA_U32 },
	[GPUSLICE_A_GPU_MASK]		= { .type = NLA_U32 },
	[GPUSLICE_A_MEM_LIMIT]		= { .type = NLA_U64 },
	[GPUSLICE_A_WEIGHT]		= { .type = NLA_U32 },
	[GPUSLICE_A_SHARE]		= { .type = NLA_U32 },
	[GPUSLICE_A_TIMESLICE_US]	= { .type = NLA_U64 },
	[GPUSLICE_A_UID]		= { .type = NLA_U32 },
	[GPUSLICE_A_GID]		= { .type = NLA_U32 },
	[GPUSLICE_A_MODE]		= { .type = NLA_U32 },
};

/*
 * Events name host pids and RM handles: only CAP_SYS_ADMIN may join. Kernels
 * without GENL_MCAST_CAP_SYS_ADMIN (before 6.7, unless backported, as Debian's
 * 6.1 has it) let anyone join: there, events are not filtered.
 */
#ifdef GENL_MCAST_CAP_SYS_ADMIN
#define GS_NL_MCAST_FLAGS	GENL_MCAST_CAP_SYS_ADMIN
#else
#define GS_NL_MCAST_FLAGS	0
#endif

static const struct genl_multicast_group gs_nl_mcgrps[] = {
	{ .name = GPUSLICE_MCGRP_EVENTS, .flags = GS_NL_MCAST_FLAGS },
};

static int gs_nl_admin(struct sk_buff *skb)
{
	return netlink_capable(skb, CAP_SYS_ADMIN) ? 0 : -EPERM;
}

/* Reads NEW/SET attributes into cfg; -EINVAL on a missing or bad value. */
static int gs_nl_parse_cfg(struct genl_info *info, struct gs_inst_cfg *cfg, bool new)
{
	struct nlattr **a = info->attrs;

	memset(cfg, 0, sizeof(*cfg));
	if (!a[GPUSLICE_A_NAME])
		return -EINVAL;
	nla_strscpy(cfg->name, a[GPUSLICE_A_NAME], sizeof(cfg->name));
	if (!gs_instance_name_valid(cfg->name))
		return -EINVAL;
	if (new) {
		if (!a[GPUSLICE_A_GPU_MASK] || !a[GPUSLICE_A_MEM_LIMIT])
			return -EINVAL;
		cfg->gpu_mask = nla_get_u32(a[GPUSLICE_A_GPU_MASK]);
		if (!cfg->gpu_mask)
			return -EINVAL;
	} else if (a[GPUSLICE_A_GPU_MASK]) {
		return -EINVAL;	/* the GPUs of an instance are fixed */
	}
	if (a[GPUSLICE_A_MEM_LIMIT]) {
		cfg->mem_limit = nla_get_u64(a[GPUSLICE_A_MEM_LIMIT]);
		if (!cfg->mem_limit)
			return -EINVAL;
		cfg->set |= GS_CFG_MEM_LIMIT;
	}
	if (a[GPUSLICE_A_WEIGHT]) {
		cfg->weight = nla_get_u32(a[GPUSLICE_A_WEIGHT]);
		if (cfg->weight < 1 || cfg->weight > GPUSLICE_WEIGHT_MAX)
			return -EINVAL;
		cfg->set |= GS_CFG_WEIGHT;
	}
	if (a[GPUSLICE_A_SHARE]) {
		cfg->share = nla_get_u32(a[GPUSLICE_A_SHARE]);
		if (cfg->share > GPUSLICE_SHARE_FULL)
			return -EINVAL;
		cfg->set |= GS_CFG_SHARE;
	}
	if (a[GPUSLICE_A_TIMESLICE_US]) {
		cfg->timeslice_us = nla_get_u64(a[GPUSLICE_A_TIMESLICE_US]);
		cfg->set |= GS_CFG_TIMESLICE;
	}
	if (a[GPUSLICE_A_UID]) {
		cfg->uid = nla_get_u32(a[GPUSLICE_A_UID]);
		cfg->set |= GS_CFG_UID;
	}
	if (a[GPUSLICE_A_GID]) {
		cfg->gid = nla_get_u32(a[GPUSLICE_A_GID]);
		cfg->set |= GS_CFG_GID;
	}
	if (a[GPUSLICE_A_MODE]) {
		cfg->mode = nla_get_u32(a[GPUSLICE_A_MODE]);
		if (cfg->mode > 0777)
			return -EINVAL;
		cfg->set |= GS_CFG_MODE;
	}
	return 0;
}

static int gs_nl_instance_new(struct sk_buff *skb, struct genl_info *info)
{
	struct gs_inst_cfg cfg;
	int err;

	err = gs_nl_admin(skb);
	if (err)
		return err;
	err = gs_nl_parse_cfg(info, &cfg, true);
	if (err)
		return err;
	return gs_instance_new(&cfg);
}

static int gs_nl_instance_set(struct sk_buff *skb, struct genl_info *info)
{
	struct gs_inst_cfg cfg;
	int err;

	err = gs_nl_admin(skb);
	if (err)
		return err;
	err = gs_nl_parse_cfg(info, &cfg, false);
	if (err)
		return err;
	return gs_instance_set(&cfg);
}

static int gs_nl_instance_del(struct sk_buff *skb, struct genl_info *info)
{
	char name[GPUSLICE_NAME_MAX];
	int err;

	err = gs_nl_admin(skb);
	if (err)
		return err;
	if (!info->attrs[GPUSLICE_A_NAME])
		return -EINVAL;
	nla_strscpy(name, info->attrs[GPUSLICE_A_NAME], sizeof(name));
	return gs_instance_del(name);
}

static int gs_nl_put_u64(struct sk_buff *skb, int type, u64 v)
{
	return nla_put_u64_64bit(skb, type, v, GPUSLICE_A_PAD);
}

/* Caller holds gs_instances_lock. */
static int gs_nl_fill_instance(struct sk_buff *skb, struct gs_instance *inst,
			       u32 portid, u32 seq, int flags)
{
	struct gs_stats st;
	struct gs_proc *proc;
	struct nlattr *pids;
	void *hdr;

	hdr = genlmsg_put(skb, portid, seq, &gs_genl_family, flags,
			  GPUSLICE_CMD_INSTANCE_GET);
	if (!hdr)
		return -EMSGSIZE;
	gs_inst_stats(inst->core, &st);
	if (nla_put_string(skb, GPUSLICE_A_NAME, inst->name) ||
	    nla_put_u32(skb, GPUSLICE_A_ID, inst->id) ||
	    nla_put_u32(skb, GPUSLICE_A_GPU_MASK, inst->gpu_mask) ||
	    gs_nl_put_u64(skb, GPUSLICE_A_MEM_LIMIT, st.mem_limit) ||
	    gs_nl_put_u64(skb, GPUSLICE_A_MEM_USED, st.mem_used) ||
	    gs_nl_put_u64(skb, GPUSLICE_A_MEM_PEAK, st.mem_peak) ||
	    nla_put_u32(skb, GPUSLICE_A_WEIGHT, inst->weight) ||
	    nla_put_u32(skb, GPUSLICE_A_SHARE, inst->share) ||
	    gs_nl_put_u64(skb, GPUSLICE_A_TIMESLICE_US, inst->timeslice_us) ||
	    nla_put_u32(skb, GPUSLICE_A_UID, from_kuid(&init_user_ns, inst->uid)) ||
	    nla_put_u32(skb, GPUSLICE_A_GID, from_kgid(&init_user_ns, inst->gid)) ||
	    nla_put_u32(skb, GPUSLICE_A_MODE, inst->mode) ||
	    gs_nl_put_u64(skb, GPUSLICE_A_NR_IOCTLS, st.nr_ioctls) ||
	    gs_nl_put_u64(skb, GPUSLICE_A_NR_REFUSED_QUOTA, st.nr_refused_quota) ||
	    gs_nl_put_u64(skb, GPUSLICE_A_NR_REFUSED_FILTER, st.nr_refused_filter))
		goto err_cancel;
	pids = nla_nest_start(skb, GPUSLICE_A_PIDS);
	if (!pids)
		goto err_cancel;
	mutex_lock(&inst->procs_lock);
	list_for_each_entry(proc, &inst->procs, list) {
		if (nla_put_u32(skb, GPUSLICE_A_PID, proc->tgid)) {
			mutex_unlock(&inst->procs_lock);
			goto err_cancel;
		}
	}
	mutex_unlock(&inst->procs_lock);
	nla_nest_end(skb, pids);
	genlmsg_end(skb, hdr);
	return 0;

err_cancel:
	genlmsg_cancel(skb, hdr);
	return -EMSGSIZE;
}

static int gs_nl_instance_get(struct sk_buff *skb, struct genl_info *info)
{
	char name[GPUSLICE_NAME_MAX];
	struct gs_instance *inst;
	struct sk_buff *msg;
	int err;

	err = gs_nl_admin(skb);
	if (err)
		return err;
	if (!info->attrs[GPUSLICE_A_NAME])
		return -EINVAL;
	nla_strscpy(name, info->attrs[GPUSLICE_A_NAME], sizeof(name));
	msg = genlmsg_new(NLMSG_GOODSIZE, GFP_KERNEL);
	if (!msg)
		return -ENOMEM;
	mutex_lock(&gs_instances_lock);
	inst = gs_instance_find(name);
	err = inst ? gs_nl_fill_instance(msg, inst, info->snd_portid, info->snd_seq, 0) :
		     -ENOENT;
	mutex_unlock(&gs_instances_lock);
	if (err) {
		nlmsg_free(msg);
		return err;
	}
	return genlmsg_reply(msg, info);
}

/* Dumps start here: the same check as every doit. */
static int gs_nl_dump_start(struct netlink_callback *cb)
{
	return gs_nl_admin(cb->skb);
}

static int gs_nl_instance_dump(struct sk_buff *skb, struct netlink_callback *cb)
{
	struct gs_instance *inst;
	long idx = 0;

	mutex_lock(&gs_instances_lock);
	list_for_each_entry(inst, &gs_instances, list) {
		if (idx++ < cb->args[0])
			continue;
		if (gs_nl_fill_instance(skb, inst, NETLINK_CB(cb->skb).portid,
					cb->nlh->nlmsg_seq, NLM_F_MULTI)) {
			idx--;
			break;
		}
	}
	mutex_unlock(&gs_instances_lock);
	cb->args[0] = idx;
	return skb->len;
}

struct gs_nl_obj_dump {
	struct sk_buff *skb;
	struct netlink_callback *cb;
	const char *name;
	long skip;
	long idx;
	bool full;
};

static int gs_nl_fill_object(struct gs_nl_obj_dump *d, const struct gs_object *o)
{
	void *hdr;

	hdr = genlmsg_put(d->skb, NETLINK_CB(d->cb->skb).portid, d->cb->nlh->nlmsg_seq,
			  &gs_genl_family, NLM_F_MULTI, GPUSLICE_CMD_OBJECT_GET);
	if (!hdr)
		return -EMSGSIZE;
	if (nla_put_string(d->skb, GPUSLICE_A_NAME, d->name) ||
	    nla_put_u32(d->skb, GPUSLICE_A_OBJ_KIND, o->obj_kind) ||
	    nla_put_u32(d->skb, GPUSLICE_A_PID, o->pid) ||
	    nla_put_u32(d->skb, GPUSLICE_A_CLIENT, o->client) ||
	    nla_put_u32(d->skb, GPUSLICE_A_HANDLE, o->handle) ||
	    nla_put_u32(d->skb, GPUSLICE_A_PARENT, o->parent) ||
	    nla_put_u32(d->skb, GPUSLICE_A_CLASS, o->klass) ||
	    nla_put_u32(d->skb, GPUSLICE_A_ENGINE, o->engine) ||
	    nla_put_u32(d->skb, GPUSLICE_A_GPU, o->gpu)) {
		genlmsg_cancel(d->skb, hdr);
		return -EMSGSIZE;
	}
	genlmsg_end(d->skb, hdr);
	return 0;
}

/* gs_for_each_object() callback, under the core lock: puts, never sleeps. */
static int gs_nl_object_one(void *ctx, const struct gs_object *o)
{
	struct gs_nl_obj_dump *d = ctx;

	if (o->obj_kind != GPUSLICE_OBJ_TSG && o->obj_kind != GPUSLICE_OBJ_CHANNEL)
		return 0;
	if (d->idx < d->skip) {
		d->idx++;
		return 0;
	}
	if (gs_nl_fill_object(d, o)) {
		d->full = true;
		return 1;
	}
	d->idx++;
	return 0;
}

static int gs_nl_object_dump(struct sk_buff *skb, struct netlink_callback *cb)
{
	const struct genl_dumpit_info *info = genl_dumpit_info(cb);
	struct nlattr *filter = info->attrs[GPUSLICE_A_NAME];
	struct gs_nl_obj_dump d = { .skb = skb, .cb = cb };
	struct gs_instance *inst;
	long n = 0;

	mutex_lock(&gs_instances_lock);
	list_for_each_entry(inst, &gs_instances, list) {
		if (n++ < cb->args[0])
			continue;
		if (filter && nla_strcmp(filter, inst->name))
			continue;
		d.name = inst->name;
		d.skip = cb->args[1];
		d.idx = 0;
		gs_for_each_object(inst->core, gs_nl_object_one, &d);
		if (d.full) {
			cb->args[0] = n - 1;
			cb->args[1] = d.idx;
			break;
		}
		cb->args[0] = n;
		cb->args[1] = 0;
	}
	mutex_unlock(&gs_instances_lock);
	return skb->len;
}

/*
 * GENL_ADMIN_PERM: genetlink refuses a command (doit or dump) from a sender
 * without CAP_NET_ADMIN before calling us; gs_nl_admin() (each doit, and
 * gs_nl_dump_start() for dumps) then asks for CAP_SYS_ADMIN.
 */
static const struct genl_ops gs_nl_ops[] = {
	{
		.cmd = GPUSLICE_CMD_INSTANCE_NEW,
		.flags = GENL_ADMIN_PERM,
		.doit = gs_nl_instance_new,
	},
	{
		.cmd = GPUSLICE_CMD_INSTANCE_DEL,
		.flags = GENL_ADMIN_PERM,
		.doit = gs_nl_instance_del,
	},
	{
		.cmd = GPUSLICE_CMD_INSTANCE_SET,
		.flags = GENL_ADMIN_PERM,
		.doit = gs_nl_instance_set,
	},
	{
		.cmd = GPUSLICE_CMD_INSTANCE_GET,
		.flags = GENL_ADMIN_PERM,
		.doit = gs_nl_instance_get,
		.start = gs_nl_dump_start,
		.dumpit = gs_nl_instance_dump,
	},
	{
		.cmd = GPUSLICE_CMD_OBJECT_GET,
		.flags = GENL_ADMIN_PERM,
		.start = gs_nl_dump_start,
		.dumpit = gs_nl_object_dump,
	},
};

static struct genl_family gs_genl_family __ro_after_init = {
	.name = GPUSLICE_GENL_NAME,
	.version = GPUSLICE_GENL_VERSION,
	.maxattr = GPUSLICE_A_MAX,
	.policy = gs_nl_policy,
	.netnsok = false,
	.module = THIS_MODULE,
	.ops = gs_nl_ops,
	.n_ops = ARRAY_SIZE(gs_nl_ops),
	.mcgrps = gs_nl_mcgrps,
	.n_mcgrps = ARRAY_SIZE(gs_nl_mcgrps),
};

void gs_netlink_event(struct gs_instance *inst, const struct gs_event *ev)
{
	struct sk_buff *skb;
	void *hdr;
	bool obj = ev->type == GPUSLICE_EV_TSG_NEW || ev->type == GPUSLICE_EV_TSG_DEL ||
		   ev->type == GPUSLICE_EV_CHANNEL_NEW || ev->type == GPUSLICE_EV_CHANNEL_DEL;
	bool refusal = ev->type == GPUSLICE_EV_ALLOC_REFUSED ||
		       ev->type == GPUSLICE_EV_FILTER_REFUSED;

	if (!READ_ONCE(gs_genl_registered))
		return;
	skb = genlmsg_new(NLMSG_DEFAULT_SIZE, GFP_KERNEL);
	if (!skb)
		return;
	hdr = genlmsg_put(skb, 0, 0, &gs_genl_family, 0, GPUSLICE_CMD_EVENT);
	if (!hdr)
		goto err_free;
	if (nla_put_u32(skb, GPUSLICE_A_EVENT, ev->type) ||
	    nla_put_string(skb, GPUSLICE_A_NAME, inst->name) ||
	    nla_put_u32(skb, GPUSLICE_A_PID, ev->pid))
		goto err_free;
	if (obj && (nla_put_u32(skb, GPUSLICE_A_OBJ_KIND, ev->obj_kind) ||
		    nla_put_u32(skb, GPUSLICE_A_CLIENT, ev->client) ||
		    nla_put_u32(skb, GPUSLICE_A_HANDLE, ev->handle) ||
		    nla_put_u32(skb, GPUSLICE_A_PARENT, ev->parent) ||
		    nla_put_u32(skb, GPUSLICE_A_CLASS, ev->klass) ||
		    nla_put_u32(skb, GPUSLICE_A_ENGINE, ev->engine) ||
		    nla_put_u32(skb, GPUSLICE_A_GPU, ev->gpu)))
		goto err_free;
	if (refusal && (gs_nl_put_u64(skb, GPUSLICE_A_SIZE, ev->size) ||
			nla_put_u32(skb, GPUSLICE_A_STATUS, ev->status) ||
			nla_put_u32(skb, GPUSLICE_A_CMD, ev->cmd) ||
			nla_put_u32(skb, GPUSLICE_A_CLASS, ev->klass)))
		goto err_free;
	genlmsg_end(skb, hdr);
	genlmsg_multicast(&gs_genl_family, skb, 0, 0, GFP_KERNEL);
	return;

err_free:
	nlmsg_free(skb);
}

int gs_netlink_init(void)
{
	int err;

	err = genl_register_family(&gs_genl_family);
	if (err)
		return err;
	WRITE_ONCE(gs_genl_registered, true);
	return 0;
}

void gs_netlink_exit(void)
{
	WRITE_ONCE(gs_genl_registered, false);
	genl_unregister_family(&gs_genl_family);
}
