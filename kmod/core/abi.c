// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * abi.c - which row of the ABI tables (nvrm_tables.c) the core decodes with:
 * the running driver's, selected by the glue before the first call.
 */
#include "core_int.h"

static const struct nvrm_table *gs_abi_table;

int gs_abi_select(const char *version)
{
	const struct nvrm_table *t = nvrm_table_find(version);

	if (!t)
		return -1;
	gs_abi_table = t;
	return 0;
}

const struct nvrm_table *gs_abi(void)
{
	return gs_abi_table ? gs_abi_table : &nvrm_tables[nvrm_nr_tables - 1];
}

static unsigned long gs_abi_put(char *buf, unsigned long size, unsigned long len, const char *s)
{
	unsigned long n = strlen(s);

	if (len + n >= size)
		n = len < size ? size - 1 - len : 0;
	memcpy(buf + len, s, n);
	buf[len + n] = '\0';
	return len + n;
}

/*
 * "535.43.02..535.288.01, 550.40.07..550.163.01, ...": the rows are oldest
 * first and each row's versions in order (nvrm_tables.c), so a branch's first
 * and last are its first row's first and its last row's last.
 */
void gs_abi_supported(char *buf, unsigned long size)
{
	const char *first = NULL, *last = NULL;
	unsigned long len = 0;
	unsigned int i, j;

	if (!size)
		return;
	buf[0] = '\0';
	for (i = 0; i <= nvrm_nr_tables; i++) {
		if (first && (i == nvrm_nr_tables ||
			      strcmp(nvrm_tables[i].branch, nvrm_tables[i - 1].branch))) {
			if (len)
				len = gs_abi_put(buf, size, len, ", ");
			len = gs_abi_put(buf, size, len, first);
			if (strcmp(first, last)) {
				len = gs_abi_put(buf, size, len, "..");
				len = gs_abi_put(buf, size, len, last);
			}
			first = NULL;
		}
		if (i == nvrm_nr_tables)
			break;
		for (j = 0; nvrm_tables[i].versions[j]; j++) {
			if (!first)
				first = nvrm_tables[i].versions[j];
			last = nvrm_tables[i].versions[j];
		}
	}
}
