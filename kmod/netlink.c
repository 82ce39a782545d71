// SPDX-License-Identifier: GPL-2.0
/*
 * netlink.c - the "gpuslice" generic netlink family; the contract is
 * uapi/gpuslice.h. Every command, reads and dumps too, needs CAP_NET_ADMIN
 * (GENL_ADMIN_PERM) and CAP_SYS_ADMIN in the initial user namespace (checked
 * by gs_nl_admin()): replies and events name host pids and RM handles. Joining
 * the events group needs CAP_SYS_ADMIN where the kernel can say so. Attributes
 * are validated strictly against gs_nl_policy; values out of range are
 * refused with -EINVAL like malformed ones.
 *
 * Handlers run in parallel (parallel_ops) and never wait for an instance's
 * core lock, which a container's call can hold for long, with
 * gs_instances_lock held: they copy what they need under it, take a
 * reference, and read the core after dropping it, inside the instance's gate
 * (gate.h; a handover closes it for a bounded time).
 *
 * Refusal events (ALLOC_REFUSED, FILTER_REFUSED) are rate-limited per
 * instance (a token bucket, GS_NL_REFUSALS_PER_SEC with a burst of
 * GS_NL_REFUSALS_BURST): a loop of refused calls would otherwise fill the
 * listeners' sockets and other instances' TSG and channel events would be
 * lost. Those, and PROC events, are never limited. What was suppressed is
 * counted (NR_EVENTS_SUPPRESSED, in INSTANCE_GET and in each refusal event).
 */
#include <linux/capability.h>
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/stringify.h>
#include <net/genetlink.h>

#include "compat.h"
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
	[GPUSLICE_A_GPU_MEM_LIMIT]	= NLA_POLICY_EXACT_LEN(sizeof(u64) * GPUSLICE_MAX_GPUS),
	[GPUSLICE_A_SAMPLE_US]		= { .type = NLA_U32 },
	[GPUSLICE_A_REPEAT_US]		= { .type = NLA_U32 },
	[GPUSLICE_A_CAPS]		= { .type = NLA_U32 },
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

/*
 * Every request: CAP_SYS_ADMIN, then the version handshake (-EPROTO when the
 * genetlink header's version is not GPUSLICE_GENL_VERSION: the sender was
 * built against another uapi/gpuslice.h).
 */
static int gs_nl_check(struct sk_buff *skb, const struct nlmsghdr *nlh,
		       struct netlink_ext_ack *extack)
{
	const struct genlmsghdr *hdr = nlmsg_data(nlh);

	if (!netlink_capable(skb, CAP_SYS_ADMIN))
		return -EPERM;
	if (hdr->version != GPUSLICE_GENL_VERSION) {
		NL_SET_ERR_MSG(extack, "gpuslice: this module speaks netlink version "
			       __stringify(GPUSLICE_GENL_VERSION));
		return -EPROTO;
	}
	return 0;
}

static int gs_nl_admin(struct sk_buff *skb, struct genl_info *info)
{
	return gs_nl_check(skb, info->nlhdr, info->extack);
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
	if (a[GPUSLICE_A_GPU_MEM_LIMIT]) {
		nla_memcpy(cfg->gpu_mem_limit, a[GPUSLICE_A_GPU_MEM_LIMIT],
			   sizeof(cfg->gpu_mem_limit));
		cfg->set |= GS_CFG_GPU_MEM_LIMIT;
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
	if (!a[GPUSLICE_A_SAMPLE_US] != !a[GPUSLICE_A_REPEAT_US])
		return -EINVAL;
	if (a[GPUSLICE_A_SAMPLE_US]) {
		cfg->sample_us = nla_get_u32(a[GPUSLICE_A_SAMPLE_US]);
		cfg->repeat_us = nla_get_u32(a[GPUSLICE_A_REPEAT_US]);
		if ((cfg->sample_us && (cfg->sample_us < GPUSLICE_SAMPLE_US_MIN ||
					cfg->sample_us > GPUSLICE_SAMPLE_US_MAX)) ||
		    (cfg->repeat_us && (cfg->repeat_us < GPUSLICE_REPEAT_US_MIN ||
					cfg->repeat_us > GPUSLICE_REPEAT_US_MAX)))
			return -EINVAL;
		cfg->set |= GS_CFG_SAMPLE;
	}
	if (a[GPUSLICE_A_CAPS]) {
		cfg->caps = nla_get_u32(a[GPUSLICE_A_CAPS]);
		if (!cfg->caps || (cfg->caps & ~GPUSLICE_CAPS_ALL))
			return -EINVAL;
		cfg->set |= GS_CFG_CAPS;
	}
	return 0;
}

static int gs_nl_instance_new(struct sk_buff *skb, struct genl_info *info)
{
	struct gs_inst_cfg cfg;
	int err;

	err = gs_nl_admin(skb, info);
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

	err = gs_nl_admin(skb, info);
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

	err = gs_nl_admin(skb, info);
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

/* instance.c gs_instance_handover(); the reply says how long new calls were held */
static int gs_nl_instance_handover(struct sk_buff *skb, struct genl_info *info)
{
	char name[GPUSLICE_NAME_MAX];
	struct gs_handover_stats hs;
	struct gs_instance *inst;
	struct sk_buff *msg;
	void *hdr;
	int err;

	err = gs_nl_admin(skb, info);
	if (err)
		return err;
	if (!info->attrs[GPUSLICE_A_NAME])
		return -EINVAL;
	nla_strscpy(name, info->attrs[GPUSLICE_A_NAME], sizeof(name));
	msg = genlmsg_new(NLMSG_DEFAULT_SIZE, GFP_KERNEL);
	if (!msg)
		return -ENOMEM;
	inst = gs_instance_get(name);
	if (!inst) {
		err = -ENOENT;
		goto err_free;
	}
	err = gs_instance_handover(inst, &hs);
	gs_instance_put(inst);
	if (err)
		goto err_free;
	hdr = genlmsg_put_reply(msg, info, &gs_genl_family, 0,
				GPUSLICE_CMD_INSTANCE_HANDOVER);
	if (!hdr ||
	    nla_put_string(msg, GPUSLICE_A_NAME, name) ||
	    gs_nl_put_u64(msg, GPUSLICE_A_HANDOVER_NS, hs.pause_ns) ||
	    gs_nl_put_u64(msg, GPUSLICE_A_HANDOVER_DRAIN_NS, hs.drain_ns) ||
	    gs_nl_put_u64(msg, GPUSLICE_A_SNAPSHOT_BYTES, hs.bytes)) {
		err = -EMSGSIZE;
		goto err_free;
	}
	genlmsg_end(msg, hdr);
	return genlmsg_reply(msg, info);

err_free:
	nlmsg_free(msg);
	return err;
}

/* the instance's core lock: counts, sums, maxima and the two histograms */
static int gs_nl_put_lock(struct sk_buff *skb, const struct gs_lock_stats *l)
{
	if (gs_nl_put_u64(skb, GPUSLICE_A_LOCK_ACQUIRED, l->acquired) ||
	    gs_nl_put_u64(skb, GPUSLICE_A_LOCK_CONTENDED, l->contended) ||
	    gs_nl_put_u64(skb, GPUSLICE_A_LOCK_HOLD_NS, l->hold_ns) ||
	    gs_nl_put_u64(skb, GPUSLICE_A_LOCK_HOLD_MAX_NS, l->hold_max_ns) ||
	    nla_put_64bit(skb, GPUSLICE_A_LOCK_HOLD_HIST, sizeof(l->hold_hist), l->hold_hist,
			  GPUSLICE_A_PAD) ||
	    gs_nl_put_u64(skb, GPUSLICE_A_LOCK_WAIT_NS, l->wait_ns) ||
	    gs_nl_put_u64(skb, GPUSLICE_A_LOCK_WAIT_MAX_NS, l->wait_max_ns) ||
	    nla_put_64bit(skb, GPUSLICE_A_LOCK_WAIT_HIST, sizeof(l->wait_hist), l->wait_hist,
			  GPUSLICE_A_PAD))
		return -EMSGSIZE;
	return 0;
}

/*
 * What INSTANCE_GET reports of one instance, gathered first and sent after,
 * so that no lock is held while messages are built: the configuration is
 * copied under gs_instances_lock, the core's counters and the process list
 * read without it, under a reference on the instance.
 */
struct gs_nl_inst {
	char name[GPUSLICE_NAME_MAX];
	u32 id;
	u32 gpu_mask;
	u32 weight;
	u32 share;
	u64 timeslice_us;
	u32 uid;
	u32 gid;
	u32 mode;
	u32 sample_us;
	u32 repeat_us;
	u32 caps;
	u64 nr_events_suppressed;
	struct gs_stats st;
	u64 gpu_limit[GPUSLICE_MAX_GPUS];
	u64 gpu_used[GPUSLICE_MAX_GPUS];
	u64 gpu_peak[GPUSLICE_MAX_GPUS];
	u32 *pids;		/* sorted; kvfree() */
	unsigned int nr_pids;
};

/* One PIDS nest stays far below the 64 KiB an attribute can hold. */
#define GS_NL_PIDS_PER_NEST	4096

static int gs_nl_cmp_u32(const void *a, const void *b)
{
	u32 x = *(const u32 *)a, y = *(const u32 *)b;

	return x < y ? -1 : x > y;
}

/* The tgids of inst->procs, sorted, in a kvmalloc'ed array (NULL when none). */
static int gs_nl_pids(struct gs_instance *inst, u32 **pidsp, unsigned int *np)
{
	unsigned int n, cap = 0;
	struct gs_proc *proc;
	u32 *pids = NULL;

	for (;;) {
		n = 0;
		mutex_lock(&inst->procs_lock);
		list_for_each_entry(proc, &inst->procs, list) {
			if (n < cap)
				pids[n] = proc->tgid;
			n++;
		}
		mutex_unlock(&inst->procs_lock);
		if (n <= cap)
			break;
		kvfree(pids);
		cap = n + n / 4 + 16;	/* room for processes attaching meanwhile */
		pids = kvmalloc_array(cap, sizeof(*pids), GFP_KERNEL);
		if (!pids)
			return -ENOMEM;
	}
	sort(pids, n, sizeof(*pids), gs_nl_cmp_u32, NULL);
	*pidsp = pids;
	*np = n;
	return 0;
}

/*
 * The first listed instance at position *pos or after it whose name matches
 * filter (any name if NULL), with a reference taken and, if s is given, its
 * configuration copied into s; *pos becomes its position. NULL past the end.
 */
static struct gs_instance *gs_nl_hold_at(long *pos, const struct nlattr *filter,
					 struct gs_nl_inst *s)
{
	struct gs_instance *inst, *found = NULL;
	long i = 0;

	mutex_lock(&gs_instances_lock);
	list_for_each_entry(inst, &gs_instances, list) {
		if (i++ < *pos)
			continue;
		if (filter && nla_strcmp(filter, inst->name))
			continue;
		gs_instance_hold(inst);
		found = inst;
		*pos = i - 1;
		break;
	}
	if (found && s) {
		memcpy(s->name, found->name, sizeof(s->name));
		s->id = found->id;
		s->gpu_mask = found->gpu_mask;
		s->weight = found->weight;
		s->share = found->share;
		s->timeslice_us = found->timeslice_us;
		s->uid = from_kuid(&init_user_ns, found->uid);
		s->gid = from_kgid(&init_user_ns, found->gid);
		s->mode = found->mode;
		s->sample_us = READ_ONCE(found->sample_us);
		s->repeat_us = READ_ONCE(found->repeat_us);
	}
	mutex_unlock(&gs_instances_lock);
	return found;
}

/*
 * Fills s from the instance at or after *pos (see gs_nl_hold_at()): the core
 * lock and procs_lock are taken here, gs_instances_lock is not held.
 * -ENOENT past the end.
 */
static int gs_nl_inst_at(struct gs_nl_inst *s, long *pos, const struct nlattr *filter)
{
	struct gs_instance *inst;
	int err;

	memset(s, 0, sizeof(*s));
	inst = gs_nl_hold_at(pos, filter, s);
	if (!inst)
		return -ENOENT;
	err = gs_gate_enter(&inst->gate);
	if (err) {
		gs_instance_put(inst);
		return err;
	}
	gs_inst_stats(inst->core, &s->st);
	gs_inst_gpu_mem(inst->core, s->gpu_limit, s->gpu_used, s->gpu_peak);
	s->caps = gs_inst_caps(inst->core);
	gs_gate_leave(&inst->gate);
	s->nr_events_suppressed = gs_nl_ratelimit_suppressed(&inst->refusal_events);
	err = gs_nl_pids(inst, &s->pids, &s->nr_pids);
	gs_instance_put(inst);
	return err;
}

static void gs_nl_inst_free(struct gs_nl_inst *s)
{
	kvfree(s->pids);
	s->pids = NULL;
}

/* A message that carries the whole of s fits in this many bytes. */
static size_t gs_nl_instance_size(unsigned int nr_pids)
{
	unsigned int nests = max(1U, DIV_ROUND_UP(nr_pids, GS_NL_PIDS_PER_NEST));

	return nla_total_size(GPUSLICE_NAME_MAX) +		/* NAME */
	       10 * nla_total_size(sizeof(u32)) +		/* ID ... MODE, SAMPLE_US, REPEAT_US, CAPS */
	       8 * nla_total_size_64bit(sizeof(u64)) +		/* MEM_LIMIT ... */
	       6 * nla_total_size_64bit(sizeof(u64)) +		/* LOCK_ACQUIRED ... */
	       2 * nla_total_size_64bit(sizeof(u64) * GPUSLICE_LOCK_HIST_BUCKETS) + /* LOCK_*_HIST */
	       3 * nla_total_size_64bit(sizeof(u64) * GPUSLICE_MAX_GPUS) + /* GPU_MEM_* */
	       nests * nla_total_size(0) +			/* PIDS */
	       nr_pids * nla_total_size(sizeof(u32));		/* PID */
}

/* pids[i..n) as PIDS nests, as many as fit; returns the index reached. */
static unsigned int gs_nl_put_pids(struct sk_buff *skb, const u32 *pids,
				   unsigned int i, unsigned int n)
{
	while (i < n) {
		unsigned int end = min(n, i + GS_NL_PIDS_PER_NEST);
		struct nlattr *nest;
		unsigned int j = i;

		nest = nla_nest_start(skb, GPUSLICE_A_PIDS);
		if (!nest)
			break;
		while (j < end && !nla_put_u32(skb, GPUSLICE_A_PID, pids[j]))
			j++;
		if (j == i) {
			nla_nest_cancel(skb, nest);
			break;
		}
		nla_nest_end(skb, nest);
		i = j;
		if (j < end)
			break;	/* the message is full */
	}
	return i;
}

/*
 * One INSTANCE_GET message: NAME and ID, every other attribute when first
 * (else it continues the previous message's PIDS), then s->pids from *next
 * on, as many as fit; *next is advanced past them. -EMSGSIZE (and nothing
 * put) when not even one pid fits, or, with no pids, the empty PIDS nest.
 */
static int gs_nl_fill_instance(struct sk_buff *skb, const struct gs_nl_inst *s,
			       bool first, unsigned int *next, u32 portid, u32 seq,
			       int flags)
{
	const struct gs_stats *st = &s->st;
	struct nlattr *nest;
	unsigned int i;
	void *hdr;

	hdr = genlmsg_put(skb, portid, seq, &gs_genl_family, flags,
			  GPUSLICE_CMD_INSTANCE_GET);
	if (!hdr)
		return -EMSGSIZE;
	if (nla_put_string(skb, GPUSLICE_A_NAME, s->name) ||
	    nla_put_u32(skb, GPUSLICE_A_ID, s->id))
		goto err_cancel;
	if (first &&
	    (nla_put_u32(skb, GPUSLICE_A_GPU_MASK, s->gpu_mask) ||
	     gs_nl_put_u64(skb, GPUSLICE_A_MEM_LIMIT, st->mem_limit) ||
	     gs_nl_put_u64(skb, GPUSLICE_A_MEM_USED, st->mem_used) ||
	     gs_nl_put_u64(skb, GPUSLICE_A_MEM_PEAK, st->mem_peak) ||
	     nla_put_64bit(skb, GPUSLICE_A_GPU_MEM_LIMIT, sizeof(s->gpu_limit), s->gpu_limit,
			   GPUSLICE_A_PAD) ||
	     nla_put_64bit(skb, GPUSLICE_A_GPU_MEM_USED, sizeof(s->gpu_used), s->gpu_used,
			   GPUSLICE_A_PAD) ||
	     nla_put_64bit(skb, GPUSLICE_A_GPU_MEM_PEAK, sizeof(s->gpu_peak), s->gpu_peak,
			   GPUSLICE_A_PAD) ||
	     nla_put_u32(skb, GPUSLICE_A_WEIGHT, s->weight) ||
	     nla_put_u32(skb, GPUSLICE_A_SHARE, s->share) ||
	     gs_nl_put_u64(skb, GPUSLICE_A_TIMESLICE_US, s->timeslice_us) ||
	     nla_put_u32(skb, GPUSLICE_A_UID, s->uid) ||
	     nla_put_u32(skb, GPUSLICE_A_GID, s->gid) ||
	     nla_put_u32(skb, GPUSLICE_A_MODE, s->mode) ||
	     nla_put_u32(skb, GPUSLICE_A_SAMPLE_US, s->sample_us) ||
	     nla_put_u32(skb, GPUSLICE_A_REPEAT_US, s->repeat_us) ||
	     nla_put_u32(skb, GPUSLICE_A_CAPS, s->caps) ||
	     gs_nl_put_u64(skb, GPUSLICE_A_NR_IOCTLS, st->nr_ioctls) ||
	     gs_nl_put_u64(skb, GPUSLICE_A_NR_REFUSED_QUOTA, st->nr_refused_quota) ||
	     gs_nl_put_u64(skb, GPUSLICE_A_NR_REFUSED_FILTER, st->nr_refused_filter) ||
	     gs_nl_put_u64(skb, GPUSLICE_A_NR_EVENTS_SUPPRESSED, s->nr_events_suppressed) ||
	     gs_nl_put_lock(skb, &st->lock)))
		goto err_cancel;
	if (*next == s->nr_pids) {
		nest = nla_nest_start(skb, GPUSLICE_A_PIDS);
		if (!nest)
			goto err_cancel;
		nla_nest_end(skb, nest);
	} else {
		i = gs_nl_put_pids(skb, s->pids, *next, s->nr_pids);
		if (i == *next)
			goto err_cancel;
		*next = i;
	}
	genlmsg_end(skb, hdr);
	return 0;

err_cancel:
	genlmsg_cancel(skb, hdr);
	return -EMSGSIZE;
}

static int gs_nl_instance_get(struct sk_buff *skb, struct genl_info *info)
{
	struct gs_nl_inst *s;
	unsigned int next = 0;
	struct sk_buff *msg;
	long pos = 0;
	int err;

	err = gs_nl_admin(skb, info);
	if (err)
		return err;
	if (!info->attrs[GPUSLICE_A_NAME])
		return -EINVAL;
	s = kmalloc(sizeof(*s), GFP_KERNEL);
	if (!s)
		return -ENOMEM;
	err = gs_nl_inst_at(s, &pos, info->attrs[GPUSLICE_A_NAME]);
	if (err)
		goto out;
	/* one message, sized to hold every pid */
	msg = genlmsg_new(gs_nl_instance_size(s->nr_pids), GFP_KERNEL | __GFP_NOWARN);
	if (!msg) {
		err = -ENOMEM;
		goto out;
	}
	err = gs_nl_fill_instance(msg, s, true, &next, info->snd_portid,
				  info->snd_seq, 0);
	if (!err && WARN_ON_ONCE(next != s->nr_pids))
		err = -EMSGSIZE;
	if (err) {
		nlmsg_free(msg);
		goto out;
	}
	err = genlmsg_reply(msg, info);
out:
	gs_nl_inst_free(s);
	kfree(s);
	return err;
}

/* Dumps start here: the same check as every doit. */
static int gs_nl_dump_start(struct netlink_callback *cb)
{
	return gs_nl_check(cb->skb, cb->nlh, cb->extack);
}

/*
 * One message per instance, or, when its pids do not fit one, that message
 * and continuations (NAME, ID, PIDS) in the next ones. cb->args: [0] the
 * instance's position, [1] its ID once its first message is out, [2] the
 * last pid sent (pids go in increasing order, so pids that attach or detach
 * between two parts are neither repeated nor skipped unless they do).
 */
static int gs_nl_instance_dump(struct sk_buff *skb, struct netlink_callback *cb)
{
	struct nlattr *filter = gs_dump_attr(cb, GPUSLICE_A_NAME);
	long pos = cb->args[0];
	struct gs_nl_inst *s;
	int err;

	s = kmalloc(sizeof(*s), GFP_KERNEL);
	if (!s)
		return -ENOMEM;
	for (;; pos++) {
		unsigned int next = 0;
		bool first;

		err = gs_nl_inst_at(s, &pos, filter);
		if (err) {
			gs_nl_inst_free(s);
			break;
		}
		first = cb->args[1] != s->id;
		if (!first)
			while (next < s->nr_pids && s->pids[next] <= cb->args[2])
				next++;
		if (first || next < s->nr_pids)
			err = gs_nl_fill_instance(skb, s, first, &next,
						  NETLINK_CB(cb->skb).portid,
						  cb->nlh->nlmsg_seq, NLM_F_MULTI);
		if (!err && next < s->nr_pids) {
			cb->args[1] = s->id;		/* the rest in the next skb */
			cb->args[2] = s->pids[next - 1];
			err = -EMSGSIZE;
		}
		gs_nl_inst_free(s);
		if (err)
			break;
		cb->args[1] = 0;
	}
	kfree(s);
	cb->args[0] = pos;
	if (err == -ENOENT || (err == -EMSGSIZE && skb->len))
		return skb->len;
	return err;
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
	if (!gs_object_gateable(o))	/* not scheduled yet: CHANNEL_NEW comes then */
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

/* cb->args: [0] the instance's position, [1] its objects already sent. */
static int gs_nl_object_dump(struct sk_buff *skb, struct netlink_callback *cb)
{
	struct nlattr *filter = gs_dump_attr(cb, GPUSLICE_A_NAME);
	struct gs_nl_obj_dump d = { .skb = skb, .cb = cb };
	struct gs_instance *inst;
	long pos = cb->args[0];

	for (;; pos++) {
		inst = gs_nl_hold_at(&pos, filter, NULL);
		if (!inst)
			break;
		d.name = inst->name;
		d.skip = cb->args[1];
		d.idx = 0;
		d.full = false;
		if (gs_gate_enter(&inst->gate)) {
			gs_instance_put(inst);
			return -EINTR;
		}
		gs_for_each_object(inst->core, gs_nl_object_one, &d);
		gs_gate_leave(&inst->gate);
		gs_instance_put(inst);
		if (d.full) {
			cb->args[1] = d.idx;
			break;
		}
		cb->args[1] = 0;
	}
	cb->args[0] = pos;
	return skb->len;
}

/*
 * GENL_ADMIN_PERM: genetlink refuses a command (doit or dump) from a sender
 * without CAP_NET_ADMIN before calling us; gs_nl_check() (each doit, and
 * gs_nl_dump_start() for dumps) then asks for CAP_SYS_ADMIN and the version.
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
	{
		.cmd = GPUSLICE_CMD_INSTANCE_HANDOVER,
		.flags = GENL_ADMIN_PERM,
		.doit = gs_nl_instance_handover,
	},
};

static struct genl_family gs_genl_family __ro_after_init = {
	.name = GPUSLICE_GENL_NAME,
	.version = GPUSLICE_GENL_VERSION,
	.maxattr = GPUSLICE_A_MAX,
	.policy = gs_nl_policy,
	.netnsok = false,
	.parallel_ops = true,	/* handlers lock what they touch, see gs_nl_hold_at() */
	.module = THIS_MODULE,
	.ops = gs_nl_ops,
	.n_ops = ARRAY_SIZE(gs_nl_ops),
	.mcgrps = gs_nl_mcgrps,
	.n_mcgrps = ARRAY_SIZE(gs_nl_mcgrps),
};

#define GS_NL_REFUSALS_PER_SEC	100
#define GS_NL_REFUSALS_BURST	100
#define GS_NL_REFUSAL_COST_NS	(NSEC_PER_SEC / GS_NL_REFUSALS_PER_SEC)

void gs_nl_ratelimit_init(struct gs_nl_ratelimit *rl)
{
	spin_lock_init(&rl->lock);
	rl->credit_ns = GS_NL_REFUSALS_BURST * GS_NL_REFUSAL_COST_NS;
	rl->last_ns = ktime_get_ns();
	rl->suppressed = 0;
}

u64 gs_nl_ratelimit_suppressed(struct gs_nl_ratelimit *rl)
{
	u64 n;

	spin_lock(&rl->lock);
	n = rl->suppressed;
	spin_unlock(&rl->lock);
	return n;
}

/* Takes one token if there is one, else counts a suppressed event. */
static bool gs_nl_ratelimit_take(struct gs_nl_ratelimit *rl, u64 *suppressed)
{
	u64 now = ktime_get_ns();
	bool ok;

	spin_lock(&rl->lock);
	rl->credit_ns = min_t(u64, rl->credit_ns + (now - rl->last_ns),
			      GS_NL_REFUSALS_BURST * GS_NL_REFUSAL_COST_NS);
	rl->last_ns = now;
	ok = rl->credit_ns >= GS_NL_REFUSAL_COST_NS;
	if (ok)
		rl->credit_ns -= GS_NL_REFUSAL_COST_NS;
	else
		rl->suppressed++;
	*suppressed = rl->suppressed;
	spin_unlock(&rl->lock);
	return ok;
}

/*
 * An event's payload: NAME and at most 14 more attributes of up to 8 bytes.
 * Sized to fit, not NLMSG_DEFAULT_SIZE: a listener's receive buffer counts
 * each message's allocation, and a page per event would let a few hundred
 * CHANNEL_WORK fill it.
 */
#define GS_NL_EVENT_SIZE	(nla_total_size(GPUSLICE_NAME_MAX) + 14 * nla_total_size(sizeof(u64)))

void gs_netlink_event(struct gs_instance *inst, const struct gs_event *ev)
{
	struct sk_buff *skb;
	void *hdr;
	bool obj = ev->type == GPUSLICE_EV_TSG_NEW || ev->type == GPUSLICE_EV_TSG_DEL ||
		   ev->type == GPUSLICE_EV_CHANNEL_NEW || ev->type == GPUSLICE_EV_CHANNEL_DEL ||
		   ev->type == GPUSLICE_EV_CHANNEL_WORK;
	bool refusal = ev->type == GPUSLICE_EV_ALLOC_REFUSED ||
		       ev->type == GPUSLICE_EV_FILTER_REFUSED;
	u64 suppressed = 0;

	if (!READ_ONCE(gs_genl_registered))
		return;
	if (refusal && !gs_nl_ratelimit_take(&inst->refusal_events, &suppressed))
		return;
	skb = genlmsg_new(GS_NL_EVENT_SIZE, GFP_KERNEL);
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
			nla_put_u32(skb, GPUSLICE_A_CLASS, ev->klass) ||
			gs_nl_put_u64(skb, GPUSLICE_A_NR_EVENTS_SUPPRESSED, suppressed)))
		goto err_free;
	genlmsg_end(skb, hdr);
	genlmsg_multicast(&gs_genl_family, skb, 0, 0, GFP_KERNEL);
	return;

err_free:
	nlmsg_free(skb);
}

/* Is anybody subscribed to the events group? */
bool gs_netlink_listening(void)
{
	return READ_ONCE(gs_genl_registered) &&
	       genl_has_listeners(&gs_genl_family, &init_net, 0);
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
