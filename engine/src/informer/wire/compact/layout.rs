//! How a [`CompactObject`](super::CompactObject) lays out its one buffer, and the builder both
//! formats write it with.
//!
//! The buffer is, in order: the object's bytes as kept (the body as it arrived, less what is
//! stripped); the strings that could not be borrowed from those bytes (JSON strings with
//! escapes, unescaped once); then a table of little-endian `u32` spans for the variable-length
//! metadata: labels and annotations (key, value), owner references (API version, kind, name,
//! uid, controller flag) and the declared fields. The fixed-size metadata (namespace, name, uid,
//! resource version, generation, deletion time) is in the object's header.
//!
//! The builder writes into buffers kept per thread and reused, so building an object makes one
//! allocation: the buffer, at its exact size.

use std::cell::RefCell;

use super::super::super::lister_watcher::Error;

/// Where a string is in an object's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: u32,
    pub(crate) len: u32,
}

impl Span {
    /// A string the object does not have.
    pub(crate) const ABSENT: Span = Span {
        start: u32::MAX,
        len: 0,
    };
    /// While building: the span's start counts from the extra strings, not the object bytes.
    const IN_EXTRA: u32 = 1 << 31;

    pub(crate) fn is_absent(self) -> bool {
        self.start == u32::MAX
    }
}

/// The `u32`s an owner reference takes in the table: four spans and the controller flag (the
/// flags come last, after the declared fields).
const OWNER_WORDS: usize = 9;
/// The `u32`s of an owner reference's four spans.
const OWNER_SPAN_WORDS: usize = 8;

/// What a build collects, besides the bytes.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub(crate) namespace: Option<Span>,
    pub(crate) name: Option<Span>,
    pub(crate) uid: Option<Span>,
    pub(crate) resource_version: Option<Span>,
    pub(crate) generation: i64,
    pub(crate) deletion_timestamp: Option<i64>,
}

/// The buffers of one build, reused by the next one on the same thread.
#[derive(Debug, Default)]
pub(crate) struct Builder {
    /// The object's bytes as kept.
    pub(crate) out: Vec<u8>,
    extra: Vec<u8>,
    labels: Vec<[Span; 2]>,
    annotations: Vec<[Span; 2]>,
    owners: Vec<([Span; 4], bool)>,
    fields: Vec<Span>,
    pub(crate) meta: Collected,
}

thread_local! {
    static BUILDER: RefCell<Builder> = RefCell::new(Builder::default());
}

/// Runs `build` with this thread's builder, emptied first.
pub(crate) fn with_builder<R>(fields: usize, build: impl FnOnce(&mut Builder) -> R) -> R {
    BUILDER.with(|cell| match cell.try_borrow_mut() {
        Ok(mut builder) => {
            builder.reset(fields);
            build(&mut builder)
        }
        // A build inside a build (never done by kcache): a builder of its own.
        Err(_) => {
            let mut builder = Builder::default();
            builder.reset(fields);
            build(&mut builder)
        }
    })
}

/// The finished layout: the buffer and where its parts are.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) data: Box<[u8]>,
    pub(crate) object_len: u32,
    pub(crate) table: u32,
    pub(crate) labels: u32,
    pub(crate) annotations: u32,
    pub(crate) owners: u32,
    pub(crate) fields: u32,
    pub(crate) meta: Collected,
}

impl Builder {
    /// Empties the builder for an object with `fields` declared fields.
    pub(crate) fn reset(&mut self, fields: usize) {
        self.out.clear();
        self.extra.clear();
        self.labels.clear();
        self.annotations.clear();
        self.owners.clear();
        self.fields.clear();
        self.fields.resize(fields, Span::ABSENT);
        self.meta = Collected::default();
    }

    /// The span of `len` bytes written at `start` of the object bytes.
    pub(crate) fn span_at(&self, start: usize, len: usize) -> Result<Span, Error> {
        let start = u32::try_from(start).ok().filter(|&s| s < Span::IN_EXTRA);
        match (start, u32::try_from(len)) {
            (Some(start), Ok(len)) => Ok(Span { start, len }),
            _ => Err(too_large()),
        }
    }

    /// A string kept beside the object bytes (one that had to be unescaped).
    pub(crate) fn extra_string(&mut self, s: &str) -> Result<Span, Error> {
        let start = u32::try_from(self.extra.len())
            .ok()
            .filter(|&s| s < Span::IN_EXTRA)
            .ok_or_else(too_large)?;
        self.extra.extend_from_slice(s.as_bytes());
        Ok(Span {
            start: start | Span::IN_EXTRA,
            len: u32::try_from(s.len()).map_err(|_| too_large())?,
        })
    }

    pub(crate) fn label(&mut self, key: Span, value: Span) {
        self.labels.push([key, value]);
    }

    pub(crate) fn annotation(&mut self, key: Span, value: Span) {
        self.annotations.push([key, value]);
    }

    /// An owner reference: API version, kind, name, uid; whether it is the controller.
    pub(crate) fn owner(&mut self, spans: [Span; 4], controller: bool) {
        self.owners.push((spans, controller));
    }

    /// Declared field `index` is at `span`.
    pub(crate) fn field(&mut self, index: usize, span: Span) {
        if let Some(slot) = self.fields.get_mut(index) {
            *slot = span;
        }
    }

    /// The buffer, in one allocation of its exact size, and where its parts are.
    pub(crate) fn finish(&mut self) -> Result<Finished, Error> {
        let object_len = self.out.len();
        let table = object_len + self.extra.len();
        let words = 4 * (self.labels.len() + self.annotations.len())
            + OWNER_WORDS * self.owners.len()
            + 2 * self.fields.len();
        let total = table + 4 * words;
        if total >= Span::IN_EXTRA as usize {
            return Err(too_large());
        }
        let resolve = |span: Span| -> Span {
            if !span.is_absent() && span.start & Span::IN_EXTRA != 0 {
                Span {
                    start: (span.start & !Span::IN_EXTRA) + object_len as u32,
                    len: span.len,
                }
            } else {
                span
            }
        };
        let mut data = Vec::with_capacity(total);
        data.extend_from_slice(&self.out);
        data.extend_from_slice(&self.extra);
        let mut push = |span: Span| {
            let span = resolve(span);
            data.extend_from_slice(&span.start.to_le_bytes());
            data.extend_from_slice(&span.len.to_le_bytes());
        };
        for [k, v] in self.labels.iter().chain(&self.annotations) {
            push(*k);
            push(*v);
        }
        for (spans, _) in &self.owners {
            for span in spans {
                push(*span);
            }
        }
        for span in &self.fields {
            push(*span);
        }
        for (_, controller) in &self.owners {
            data.extend_from_slice(&u32::from(*controller).to_le_bytes());
        }
        debug_assert_eq!(data.len(), total);
        let mut meta = std::mem::take(&mut self.meta);
        for span in [
            &mut meta.namespace,
            &mut meta.name,
            &mut meta.uid,
            &mut meta.resource_version,
        ]
        .into_iter()
        .flatten()
        {
            *span = resolve(*span);
        }
        let count = |n: usize| n as u32;
        Ok(Finished {
            data: data.into_boxed_slice(),
            object_len: object_len as u32,
            table: table as u32,
            labels: count(self.labels.len()),
            annotations: count(self.annotations.len()),
            owners: count(self.owners.len()),
            fields: count(self.fields.len()),
            meta,
        })
    }
}

fn too_large() -> Error {
    Error::Decode("an object of 2 GiB or more cannot be kept compact".to_owned())
}

/// Reads the table of a finished buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Table<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) start: u32,
    pub(crate) labels: u32,
    pub(crate) annotations: u32,
    pub(crate) owners: u32,
    pub(crate) fields: u32,
}

impl<'a> Table<'a> {
    fn word(&self, index: usize) -> u32 {
        let at = self.start as usize + 4 * index;
        match self.data.get(at..at + 4) {
            Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]),
            // The builder wrote every word it counted: unreachable, and harmless (absent).
            _ => u32::MAX,
        }
    }

    fn span(&self, index: usize) -> Span {
        Span {
            start: self.word(index),
            len: self.word(index + 1),
        }
    }

    /// The string at `span`; `None` when absent.
    pub(crate) fn str(&self, span: Span) -> Option<&'a str> {
        str_at(self.data, span)
    }

    pub(crate) fn label(&self, i: usize) -> (&'a str, &'a str) {
        self.pair(4 * i)
    }

    pub(crate) fn annotation(&self, i: usize) -> (&'a str, &'a str) {
        self.pair(4 * (self.labels as usize + i))
    }

    fn pair(&self, at: usize) -> (&'a str, &'a str) {
        (
            self.str(self.span(at)).unwrap_or(""),
            self.str(self.span(at + 2)).unwrap_or(""),
        )
    }

    fn owners_start(&self) -> usize {
        4 * (self.labels + self.annotations) as usize
    }

    fn fields_start(&self) -> usize {
        self.owners_start() + OWNER_SPAN_WORDS * self.owners as usize
    }

    /// Owner reference `i`: API version, kind, name, uid, controller.
    pub(crate) fn owner(&self, i: usize) -> ([&'a str; 4], bool) {
        let at = self.owners_start() + OWNER_SPAN_WORDS * i;
        let s = |k: usize| self.str(self.span(at + 2 * k)).unwrap_or("");
        let flags = self.fields_start() + 2 * self.fields as usize;
        ([s(0), s(1), s(2), s(3)], self.word(flags + i) != 0)
    }

    /// Declared field `i`.
    pub(crate) fn field(&self, i: usize) -> Option<&'a str> {
        if i >= self.fields as usize {
            return None;
        }
        self.str(self.span(self.fields_start() + 2 * i))
    }
}

/// The string at `span` of `data`: checked as UTF-8 when the object was built, so the check
/// here only fails for an absent span.
pub(crate) fn str_at(data: &[u8], span: Span) -> Option<&str> {
    if span.is_absent() {
        return None;
    }
    let bytes = data.get(span.start as usize..(span.start as usize + span.len as usize))?;
    std::str::from_utf8(bytes).ok()
}
