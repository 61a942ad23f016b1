-- OpenTelemetry (SQLite flavour): the W3C trace context of the span that created
-- a run or a task: its traceparent, then one space and its tracestate when it
-- has one; NULL when no trace was being recorded or propagated. The spans that
-- tick the run and run the task later, in any process and after any restart,
-- are its children (docs/observability.md).

ALTER TABLE runs ADD COLUMN trace_context TEXT;
ALTER TABLE tasks ADD COLUMN trace_context TEXT;
