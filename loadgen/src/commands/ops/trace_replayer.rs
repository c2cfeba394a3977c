//! The replay loop, generic over the queue and the known store, so every engine runs the very
//! same code and only its constructors differ.

use std::io::{BufRead, Write};
use std::sync::Arc;

use kcache::{
    process_deltas, DeltaQueue, IndexValues, Indexers, Key, KeyError, KeyFn, KnownObjects,
    NoopHandler, QueueError, QueueOptions, Store, Tombstone, TryPop,
};

use super::output::{OutputLine, PoppedLine};
use super::trace::{parse_op, Op, TraceConfig, TraceObject};
use super::{OpsError, Refusal, ReplaySummary};

/// The key function given to queues and stores.
fn trace_key_fn() -> KeyFn<TraceObject> {
    Arc::new(TraceObject::key_of)
}

/// The known store's indexes: one, `namespace`, as the brief of `loadgen ops` asks, so the
/// store is exercised as the indexer a real informer would use.
fn trace_indexers() -> Indexers<TraceObject> {
    vec![(
        "namespace".to_owned(),
        Arc::new(|obj: &TraceObject| IndexValues::from_elem(obj.namespace.clone(), 1)),
    )]
}

/// One engine under replay: the queue, and the known store it was given, if any.
struct Replayer<Q, S> {
    queue: Q,
    known: Option<Arc<S>>,
}

impl<Q, S> Replayer<Q, S>
where
    Q: DeltaQueue<TraceObject>,
    S: Store<TraceObject> + 'static,
{
    fn new(
        config: TraceConfig,
        new_queue: impl FnOnce(QueueOptions<TraceObject>) -> Q,
        new_store: impl FnOnce(KeyFn<TraceObject>, Indexers<TraceObject>) -> S,
    ) -> Self {
        let opts = QueueOptions::new(trace_key_fn())
            .emit_replaced(config.emit_replaced)
            .compact_updates(config.compact_updates);
        let (opts, known) = if config.known_objects {
            let store = Arc::new(new_store(trace_key_fn(), trace_indexers()));
            let view: Arc<dyn KnownObjects<TraceObject>> = Arc::clone(&store) as _;
            (opts.known_objects(view), Some(store))
        } else {
            (opts, None)
        };
        Self {
            queue: new_queue(opts),
            known,
        }
    }

    /// Applies one op (never `config`), handing every output line to `emit`. A refused
    /// operation comes back as `Ok(Err(..))`: it is reported and the replay goes on.
    fn apply<E>(
        &self,
        op: Op,
        emit: &mut impl FnMut(OutputLine) -> Result<(), E>,
    ) -> Result<Result<(), QueueError>, E> {
        let refused = match op {
            // The caller handles config before any engine exists.
            Op::Config(_) => Ok(()),
            Op::Add(obj) => self.queue.add(obj),
            Op::Update(obj) => self.queue.update(obj),
            Op::Delete(obj) => self.queue.delete(obj),
            Op::DeleteTombstone { key, last_known } => {
                // A tombstone carries its key, so no key function runs; the replay applies
                // the trace's one key rule (empty means no identity) itself, identically for
                // every engine.
                if key.as_str().is_empty() {
                    Err(KeyError::new("the tombstone's \"key\" is empty").into())
                } else {
                    self.queue.delete_tombstone(Tombstone { key, last_known })
                }
            }
            Op::Replace(objs) => self.queue.replace(objs, ""),
            Op::Resync => self.queue.resync(),
            Op::Pop => {
                let line = match self.try_pop() {
                    TryPop::Popped(line) => OutputLine::Popped(line),
                    TryPop::Empty => OutputLine::NothingQueued { closed: false },
                    TryPop::Closed => OutputLine::NothingQueued { closed: true },
                };
                emit(line)?;
                Ok(())
            }
            Op::Drain => {
                while let TryPop::Popped(line) = self.try_pop() {
                    emit(OutputLine::Popped(line))?;
                }
                Ok(())
            }
            Op::HasSynced => {
                emit(OutputLine::HasSynced(self.queue.has_synced()))?;
                Ok(())
            }
            Op::Keys => {
                let mut keys = self.queue.list_keys();
                keys.sort();
                emit(OutputLine::Keys(keys))?;
                Ok(())
            }
            Op::Known => {
                emit(OutputLine::Known(self.known_sorted()))?;
                Ok(())
            }
            Op::Close => {
                self.queue.close();
                Ok(())
            }
        };
        Ok(refused)
    }

    /// One non-blocking pop; with a known store, the popped deltas are applied to it inside
    /// the process function, as an informer's consumer does.
    fn try_pop(&self) -> TryPop<PoppedLine> {
        let known = self.known.as_deref();
        self.queue.try_pop(|deltas, initial| {
            if let Some(store) = known {
                process_deltas(store, &mut NoopHandler, &deltas, initial);
            }
            PoppedLine::new(&deltas, initial)
        })
    }

    /// The known store as `(key, version)` pairs sorted by key; empty without a known store.
    fn known_sorted(&self) -> Vec<(Key, i64)> {
        let Some(store) = &self.known else {
            return Vec::new();
        };
        let mut known: Vec<(Key, i64)> = store
            .list_keys()
            .into_iter()
            .filter_map(|key| store.get_by_key(&key).map(|obj| (key, obj.v)))
            .collect();
        known.sort();
        known
    }
}

/// Replays the trace on `input` through the engine the two constructors build, writing the
/// output lines to `output` and each refusal to `log` as it happens.
pub(super) fn run<Q, S>(
    mut input: impl BufRead,
    output: &mut impl Write,
    log: &mut dyn Write,
    new_queue: impl FnOnce(QueueOptions<TraceObject>) -> Q,
    new_store: impl FnOnce(KeyFn<TraceObject>, Indexers<TraceObject>) -> S,
) -> Result<ReplaySummary, OpsError>
where
    Q: DeltaQueue<TraceObject>,
    S: Store<TraceObject> + 'static,
{
    let mut summary = ReplaySummary::default();
    let mut constructors = Some((new_queue, new_store));
    let mut engine: Option<Replayer<Q, S>> = None;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let line_no = summary.lines + 1;
        let read = input
            .read_until(b'\n', &mut buf)
            .map_err(|source| OpsError::Read {
                line: line_no,
                source,
            });
        let read = match read {
            Ok(read) => read,
            Err(e) => return Err(flush_then(output, e)),
        };
        if read == 0 {
            break;
        }
        summary.lines = line_no;
        let malformed = |message: String| OpsError::Malformed {
            line: line_no,
            message,
        };
        let text = match std::str::from_utf8(&buf) {
            Ok(text) => text.trim(),
            Err(e) => {
                let err = malformed(format!("not valid UTF-8 ({e}); save the trace as UTF-8"));
                return Err(flush_then(output, err));
            }
        };
        if text.is_empty() {
            continue;
        }
        let op = match parse_op(text) {
            Ok(op) => op,
            Err(message) => return Err(flush_then(output, malformed(message))),
        };
        summary.ops += 1;
        if let Some((new_queue, new_store)) = constructors.take() {
            // The first non-blank line: the queue is built from it, so a config line is only
            // meaningful here.
            let config = match &op {
                Op::Config(config) => *config,
                _ => TraceConfig::default(),
            };
            engine = Some(Replayer::new(config, new_queue, new_store));
            if let Op::Config(_) = op {
                continue;
            }
        } else if let Op::Config(_) = op {
            let err = malformed(
                "\"config\" is only allowed as the first non-blank line; move it to the top of \
                 the trace"
                    .to_owned(),
            );
            return Err(flush_then(output, err));
        }
        // Always built by now: the branch above runs on the first non-blank line.
        let Some(replayer) = engine.as_ref() else {
            continue;
        };
        let op_name = op.name();
        let mut emit = |line: OutputLine| {
            summary.outputs += 1;
            line.write_to(output).map_err(OpsError::Write)
        };
        if let Err(error) = replayer.apply(op, &mut emit)? {
            let refusal = Refusal {
                line: line_no,
                op: op_name,
                error,
            };
            // The log is a diagnostic side channel (stderr for the CLI): failing to write to
            // it must not change what the replay does or outputs.
            let _ = writeln!(log, "{refusal}");
            summary.refusals.push(refusal);
        }
    }
    output.flush().map_err(OpsError::Write)?;
    Ok(summary)
}

/// Flushes what was written so far, then hands back `err`: the output lines before a bad line
/// must reach the reader. A failing flush is secondary to the error being reported.
fn flush_then(output: &mut impl Write, err: OpsError) -> OpsError {
    let _ = output.flush();
    err
}
