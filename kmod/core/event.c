// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * event.c - the events a call collects under in->lock (a new or freed TSG or
 * channel, a process's first or last client, a refusal), delivered to the
 * glue's gs_inst_ops.event once the lock is dropped.
 */
#include "core_int.h"

void gs_evq_init(struct gs_evq *q)
{
	memset(q, 0, sizeof(*q));
}

void gs_evq_push(struct gs_evq *q, const struct gs_event *ev)
{
	int i = q->n - GS_EVQ_INLINE;

	if (q->n < GS_EVQ_INLINE) {
		q->ev[q->n++] = *ev;
		return;
	}
	if (i >= q->cap) {
		int cap = q->cap ? q->cap * 2 : 32;
		struct gs_event *heap = gs_zalloc(sizeof(*heap) * cap);

		if (!heap) {
			q->dropped++;
			return;
		}
		if (q->heap) {
			memcpy(heap, q->heap, sizeof(*heap) * q->cap);
			gs_free(q->heap);
		}
		q->heap = heap;
		q->cap = cap;
	}
	q->heap[i] = *ev;
	q->n++;
}

/* deliver, without the lock held */
void gs_evq_flush(struct gs_inst *in, struct gs_evq *q)
{
	int i;

	for (i = 0; i < q->n && in->ops.event; i++) {
		const struct gs_event *ev;

		ev = i < GS_EVQ_INLINE ? &q->ev[i] : &q->heap[i - GS_EVQ_INLINE];

		in->ops.event(in->ops.ctx, ev);
	}
	gs_free(q->heap);
	gs_evq_init(q);
}
