// SPDX-License-Identifier: GPL-2.0
/*
 * nvstub_proc.c - /proc/nvstub of the nvstub TEST DOUBLE:
 *  implemented  what this stand-in answers, one "KIND 0xHEX" a line, KIND
 *               being esc (nvidiactl/nvidiaN escape nr), uvm (nvidia-uvm
 *               command), class (RM_ALLOC class) or ctrl (RM_CONTROL cmd);
 *               anything else gets NV_ERR_NOT_SUPPORTED / INVALID_CLASS / -EINVAL
 *  engine       the simulated engine's channels (nvstub_engine.c)
 *  clients      live RM clients: "client=0xH pid=TGID vidmem=BYTES" (vidmem:
 *               pool bytes of the memory the client owns, nvstub_rm.c)
 *  pool         each GPU's video memory pool: "gpu=N total=BYTES used=BYTES"
 */
#include <linux/proc_fs.h>
#include <linux/seq_file.h>

#include "nvstub.h"

static struct proc_dir_entry *nvstub_proc_dir;

static int nvstub_implemented_show(struct seq_file *m, void *v)
{
	unsigned int i;

	for (i = 0; i < nvstub_esc_count; i++)
		seq_printf(m, "esc 0x%x\n", nvstub_esc_list[i]);
	for (i = 0; i < nvstub_uvm_count; i++)
		seq_printf(m, "uvm 0x%x\n", nvstub_uvm_cmd(i));
	for (i = 0; i < nvstub_class_count; i++)
		seq_printf(m, "class 0x%x\n", nvstub_class_list[i]);
	for (i = 0; i < nvstub_ctrl_count; i++)
		seq_printf(m, "ctrl 0x%x\n", nvstub_ctrl_cmd(i));
	return 0;
}

static int nvstub_engine_show(struct seq_file *m, void *v)
{
	mutex_lock(&nvstub_lock);
	nvstub_engine_report(m);
	mutex_unlock(&nvstub_lock);
	return 0;
}

static int nvstub_clients_show(struct seq_file *m, void *v)
{
	mutex_lock(&nvstub_lock);
	nvstub_rm_report(m);
	mutex_unlock(&nvstub_lock);
	return 0;
}

static int nvstub_pool_show(struct seq_file *m, void *v)
{
	mutex_lock(&nvstub_lock);
	nvstub_mem_report(m);
	mutex_unlock(&nvstub_lock);
	return 0;
}

int nvstub_proc_init(void)
{
	nvstub_proc_dir = proc_mkdir("nvstub", NULL);
	if (!nvstub_proc_dir)
		return -ENOMEM;
	if (!proc_create_single("implemented", 0444, nvstub_proc_dir,
				nvstub_implemented_show) ||
	    !proc_create_single("engine", 0444, nvstub_proc_dir,
				nvstub_engine_show) ||
	    !proc_create_single("clients", 0444, nvstub_proc_dir,
				nvstub_clients_show) ||
	    !proc_create_single("pool", 0444, nvstub_proc_dir,
				nvstub_pool_show)) {
		proc_remove(nvstub_proc_dir);
		return -ENOMEM;
	}
	return 0;
}

void nvstub_proc_exit(void)
{
	proc_remove(nvstub_proc_dir);
}
