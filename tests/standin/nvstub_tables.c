// SPDX-License-Identifier: GPL-2.0 OR MIT
/* the ABI tables the module decodes with (kmod/core/nvrm_tables.c): the stand-in
 * answers as the release its version parameter names */
#include "nvrm_tables.c"
