//! Deltas: what happened to an object, in order.

use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::key::Key;

/// What happened to an object (client-go's `DeltaType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeltaType {
    /// The object was created.
    Added,
    /// The object changed.
    Updated,
    /// The object was deleted; the payload may be a [`Tombstone`].
    Deleted,
    /// The object was (re)listed by `replace` with `emit_replaced` set.
    Replaced,
    /// A periodic resync, or a relist without `emit_replaced`.
    Sync,
}

impl DeltaType {
    /// The name client-go gives it, as the trace format writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            DeltaType::Added => "Added",
            DeltaType::Updated => "Updated",
            DeltaType::Deleted => "Deleted",
            DeltaType::Replaced => "Replaced",
            DeltaType::Sync => "Sync",
        }
    }
}

impl fmt::Display for DeltaType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// client-go's `DeletedFinalStateUnknown`: the object was deleted while the watch was down.
///
/// `last_known` is the newest state the cache had, if any.
#[derive(Debug)]
pub struct Tombstone<T> {
    /// The key of the deleted object.
    pub key: Key,
    /// The newest state seen before the deletion was detected, if any.
    pub last_known: Option<Arc<T>>,
}

impl<T> Clone for Tombstone<T> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            last_known: self.last_known.clone(),
        }
    }
}

/// The payload of a delta: an object, or (for [`DeltaType::Deleted`] only) a tombstone.
#[derive(Debug)]
pub enum DeltaObject<T> {
    /// A state of the object.
    Object(Arc<T>),
    /// A deletion noticed on relist: see [`Tombstone`]. Boxed behind an `Arc` so a delta stays
    /// two words wide.
    Tombstone(Arc<Tombstone<T>>),
}

impl<T> DeltaObject<T> {
    /// The object, if this is not a tombstone.
    pub fn object(&self) -> Option<&Arc<T>> {
        match self {
            DeltaObject::Object(obj) => Some(obj),
            DeltaObject::Tombstone(_) => None,
        }
    }

    /// The tombstone, if this is one.
    pub fn tombstone(&self) -> Option<&Tombstone<T>> {
        match self {
            DeltaObject::Object(_) => None,
            DeltaObject::Tombstone(t) => Some(t),
        }
    }

    /// Whether this is a tombstone.
    pub fn is_tombstone(&self) -> bool {
        matches!(self, DeltaObject::Tombstone(_))
    }

    /// The object, or a tombstone's last known state: the newest object this payload knows.
    pub fn last_known(&self) -> Option<&Arc<T>> {
        match self {
            DeltaObject::Object(obj) => Some(obj),
            DeltaObject::Tombstone(t) => t.last_known.as_ref(),
        }
    }
}

impl<T> Clone for DeltaObject<T> {
    fn clone(&self) -> Self {
        match self {
            DeltaObject::Object(obj) => DeltaObject::Object(Arc::clone(obj)),
            DeltaObject::Tombstone(t) => DeltaObject::Tombstone(Arc::clone(t)),
        }
    }
}

impl<T> From<Arc<T>> for DeltaObject<T> {
    fn from(obj: Arc<T>) -> Self {
        DeltaObject::Object(obj)
    }
}

impl<T> From<Tombstone<T>> for DeltaObject<T> {
    fn from(t: Tombstone<T>) -> Self {
        DeltaObject::Tombstone(Arc::new(t))
    }
}

/// One change: what happened, and the object (or tombstone) it happened to.
pub struct Delta<T> {
    /// What happened.
    pub kind: DeltaType,
    /// The object after it happened; a tombstone only when `kind` is `Deleted`.
    pub object: DeltaObject<T>,
}

impl<T> Delta<T> {
    /// A delta carrying an object.
    pub fn new(kind: DeltaType, obj: Arc<T>) -> Self {
        Self {
            kind,
            object: DeltaObject::Object(obj),
        }
    }

    /// A `Deleted` delta carrying a tombstone.
    pub fn tombstone(t: Tombstone<T>) -> Self {
        Self {
            kind: DeltaType::Deleted,
            object: DeltaObject::Tombstone(Arc::new(t)),
        }
    }
}

impl<T> Clone for Delta<T> {
    fn clone(&self) -> Self {
        Self {
            kind: self.kind,
            object: self.object.clone(),
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for Delta<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.kind)?;
        match &self.object {
            DeltaObject::Object(obj) => write!(f, "{obj:?}")?,
            DeltaObject::Tombstone(t) => write!(f, "{t:?}")?,
        }
        f.write_str(")")
    }
}

/// Inline room for this many deltas per key before spilling to the heap: most keys hold one or
/// two when they are popped.
const INLINE_DELTAS: usize = 2;

/// A key's deltas without the key, as the engines store them (the map holds the key).
pub(crate) type DeltaList<T> = SmallVec<[Delta<T>; INLINE_DELTAS]>;

/// Whether a key whose newest queued delta is `last` absorbs `incoming` instead of growing by
/// one delta:
///
/// - client-go's `dedupDeltas`: two newest `Deleted` deltas become one;
/// - with `compact` (the opt-in [`compact_updates`](crate::QueueOptions::compact_updates)
///   mode): an `Updated`, `Sync` or `Replaced` delta replaces a newest `Updated`, `Sync` or
///   `Replaced` one. All three say "this is the object's newest state"; a consumer applies them
///   alike, so only the newest matters to a level-triggered controller. `Added` and `Deleted`
///   are never compacted: each is an event a handler must see.
fn absorbs(last: DeltaType, incoming: DeltaType, compact: bool) -> bool {
    let is_state = |kind: DeltaType| {
        matches!(
            kind,
            DeltaType::Updated | DeltaType::Sync | DeltaType::Replaced
        )
    };
    (last == DeltaType::Deleted && incoming == DeltaType::Deleted)
        || (compact && is_state(last) && is_state(incoming))
}

/// Whether appending a delta of type `kind` to `list` (with [`push_delta`]) adds a delta rather
/// than being absorbed by the newest one: what a producer asks before it waits for room.
pub(crate) fn push_grows<T>(list: &[Delta<T>], kind: DeltaType, compact: bool) -> bool {
    list.last()
        .is_none_or(|last| !absorbs(last.kind, kind, compact))
}

/// Appends `delta` to `list`, applying client-go's `dedupDeltas` (two newest `Deleted`
/// deltas become one, the older unless the older is a tombstone) and, with `compact`, update
/// compaction (the newer state replaces the older; see [`absorbs`]). Returns whether the list
/// grew by one delta; otherwise its length is unchanged.
pub(crate) fn push_delta<T>(list: &mut DeltaList<T>, delta: Delta<T>, compact: bool) -> bool {
    if let Some(last) = list.last_mut() {
        if absorbs(last.kind, delta.kind, compact) {
            // Deleted + Deleted keeps the older unless the older is a tombstone; a compacted
            // state keeps the newer (object and type).
            if last.kind != DeltaType::Deleted || last.object.is_tombstone() {
                *last = delta;
            }
            return false;
        }
    }
    list.push(delta);
    true
}

/// client-go's `dedupDeltas` on append: two newest `Deleted` deltas become one, the older
/// unless the older is a tombstone.
pub(crate) fn push_dedup<T>(list: &mut DeltaList<T>, delta: Delta<T>) {
    push_delta(list, delta, false);
}

/// The deltas of one key, oldest first; never empty while queued.
///
/// Carries its key, computed once when the first delta was queued, so consumers never call the
/// key function again.
#[derive(Debug)]
pub struct Deltas<T> {
    key: Key,
    list: DeltaList<T>,
}

impl<T> Deltas<T> {
    /// An empty list for `key`.
    pub fn new(key: Key) -> Self {
        Self {
            key,
            list: SmallVec::new(),
        }
    }

    /// A list for `key` holding `deltas`, oldest first.
    pub fn from_vec(key: Key, deltas: Vec<Delta<T>>) -> Self {
        Self {
            key,
            list: SmallVec::from_vec(deltas),
        }
    }

    /// The key all these deltas belong to.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The oldest delta.
    pub fn oldest(&self) -> Option<&Delta<T>> {
        self.list.first()
    }

    /// The newest delta.
    pub fn newest(&self) -> Option<&Delta<T>> {
        self.list.last()
    }

    /// Appends `delta`, then applies client-go's `dedupDeltas`: if the two newest deltas are
    /// both `Deleted`, they become one, the older unless the older is a tombstone.
    pub fn push_dedup(&mut self, delta: Delta<T>) {
        push_dedup(&mut self.list, delta);
    }

    /// Appends `delta` with dedup and, with `compact`, update compaction ([`push_delta`]).
    /// Returns whether the list grew.
    pub(crate) fn push_delta(&mut self, delta: Delta<T>, compact: bool) -> bool {
        push_delta(&mut self.list, delta, compact)
    }

    /// A list for `key` made of an engine's keyless list.
    pub(crate) fn from_list(key: Key, list: DeltaList<T>) -> Self {
        Self { key, list }
    }

    /// Appends `delta` without deduplication.
    pub fn push(&mut self, delta: Delta<T>) {
        self.list.push(delta);
    }

    /// Moves every delta of `other` to the end of `self`, deduplicating at the seam.
    pub fn append(&mut self, other: Deltas<T>) {
        for delta in other.list {
            self.push_dedup(delta);
        }
    }

    /// Removes all deltas and returns them, leaving `self` empty.
    pub fn take(&mut self) -> Deltas<T> {
        Deltas {
            key: self.key.clone(),
            list: std::mem::take(&mut self.list),
        }
    }

    /// The deltas, oldest first.
    pub fn as_slice(&self) -> &[Delta<T>] {
        &self.list
    }

    /// The deltas the list holds on the heap (its capacity once it spilled its inline room,
    /// else 0), for [`Footprint`](crate::Footprint)s.
    pub(crate) fn heap_capacity(&self) -> usize {
        if self.list.spilled() {
            self.list.capacity()
        } else {
            0
        }
    }

    /// Splits into key and the engines' keyless list.
    pub(crate) fn into_list(self) -> (Key, DeltaList<T>) {
        (self.key, self.list)
    }

    /// Splits into key and deltas.
    pub fn into_parts(self) -> (Key, Vec<Delta<T>>) {
        (self.key, self.list.into_vec())
    }

    /// What applying these deltas in order leaves in a store: decided by the last delta that
    /// stores or removes an object (a tombstone outside a `Deleted` changes nothing). `None`
    /// when no delta does, and the store keeps what it held.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kcache::{Delta, DeltaType, Deltas, FinalState, Key};
    ///
    /// let mut deltas = Deltas::new(Key::new("ns/a"));
    /// deltas.push(Delta::new(DeltaType::Added, Arc::new(1)));
    /// deltas.push(Delta::new(DeltaType::Updated, Arc::new(2)));
    /// assert!(matches!(deltas.final_state(), Some(FinalState::Stored(obj)) if **obj == 2));
    /// deltas.push(Delta::new(DeltaType::Deleted, Arc::new(2)));
    /// assert!(matches!(deltas.final_state(), Some(FinalState::Removed)));
    /// ```
    pub fn final_state(&self) -> Option<FinalState<'_, T>> {
        self.list
            .iter()
            .rev()
            .find_map(|delta| match (delta.kind, &delta.object) {
                (DeltaType::Deleted, _) => Some(FinalState::Removed),
                (_, DeltaObject::Object(obj)) => Some(FinalState::Stored(obj)),
                (_, DeltaObject::Tombstone(_)) => None,
            })
    }
}

/// What a key's deltas leave in a store ([`Deltas::final_state`]).
#[derive(Debug)]
pub enum FinalState<'a, T> {
    /// The key holds this object.
    Stored(&'a Arc<T>),
    /// The key holds nothing.
    Removed,
}

impl<T> std::ops::Deref for Deltas<T> {
    type Target = [Delta<T>];
    fn deref(&self) -> &[Delta<T>] {
        &self.list
    }
}

impl<T> IntoIterator for Deltas<T> {
    type Item = Delta<T>;
    type IntoIter = smallvec::IntoIter<[Delta<T>; INLINE_DELTAS]>;
    fn into_iter(self) -> Self::IntoIter {
        self.list.into_iter()
    }
}

impl<'a, T> IntoIterator for &'a Deltas<T> {
    type Item = &'a Delta<T>;
    type IntoIter = std::slice::Iter<'a, Delta<T>>;
    fn into_iter(self) -> Self::IntoIter {
        self.list.iter()
    }
}

impl<T> Clone for Deltas<T> {
    fn clone(&self) -> Self {
        Self {
            key: self.key.clone(),
            list: self.list.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: u32) -> Arc<u32> {
        Arc::new(v)
    }

    /// The stored version, `Some(0)` for a removal, `None` when nothing is written.
    fn final_version(d: &Deltas<u32>) -> Option<u32> {
        d.final_state().map(|state| match state {
            FinalState::Stored(obj) => **obj,
            FinalState::Removed => 0,
        })
    }

    #[test]
    fn the_final_state_is_the_last_delta_that_stores_or_removes() {
        let mut d = Deltas::new(Key::new("ns/a"));
        assert_eq!(final_version(&d), None, "no delta writes nothing");
        d.push(Delta::new(DeltaType::Deleted, obj(1)));
        d.push(Delta::new(DeltaType::Added, obj(2)));
        d.push(Delta::new(DeltaType::Sync, obj(3)));
        assert_eq!(final_version(&d), Some(3), "re-added after a delete");
        d.push(Delta::tombstone(Tombstone {
            key: Key::new("ns/a"),
            last_known: Some(obj(3)),
        }));
        assert_eq!(final_version(&d), Some(0), "a tombstone's Deleted removes");
        // A tombstone outside a Deleted (only ever made by hand) changes nothing: the delta
        // before it decides.
        let mut d = Deltas::new(Key::new("ns/b"));
        d.push(Delta::new(DeltaType::Updated, obj(4)));
        d.push(Delta {
            kind: DeltaType::Replaced,
            object: DeltaObject::Tombstone(Arc::new(Tombstone {
                key: Key::new("ns/b"),
                last_known: None,
            })),
        });
        assert_eq!(final_version(&d), Some(4));
    }

    fn kinds(d: &Deltas<u32>) -> Vec<(DeltaType, bool, Option<u32>)> {
        d.iter()
            .map(|d| {
                (
                    d.kind,
                    d.object.is_tombstone(),
                    d.object.last_known().map(|o| **o),
                )
            })
            .collect()
    }

    #[test]
    fn dedup_two_deletes_keeps_the_older() {
        let mut d = Deltas::new(Key::new("k"));
        d.push_dedup(Delta::new(DeltaType::Deleted, obj(1)));
        d.push_dedup(Delta::new(DeltaType::Deleted, obj(2)));
        assert_eq!(kinds(&d), [(DeltaType::Deleted, false, Some(1))]);
    }

    #[test]
    fn dedup_tombstone_then_delete_keeps_the_newer() {
        let mut d = Deltas::new(Key::new("k"));
        d.push_dedup(Delta::tombstone(Tombstone {
            key: Key::new("k"),
            last_known: Some(obj(1)),
        }));
        d.push_dedup(Delta::new(DeltaType::Deleted, obj(2)));
        assert_eq!(kinds(&d), [(DeltaType::Deleted, false, Some(2))]);
    }

    #[test]
    fn dedup_delete_then_tombstone_keeps_the_older_delete() {
        let mut d = Deltas::new(Key::new("k"));
        d.push_dedup(Delta::new(DeltaType::Deleted, obj(1)));
        d.push_dedup(Delta::tombstone(Tombstone {
            key: Key::new("k"),
            last_known: None,
        }));
        assert_eq!(kinds(&d), [(DeltaType::Deleted, false, Some(1))]);
    }

    #[test]
    fn dedup_leaves_non_delete_pairs_alone() {
        let mut d = Deltas::new(Key::new("k"));
        d.push_dedup(Delta::new(DeltaType::Updated, obj(1)));
        d.push_dedup(Delta::new(DeltaType::Deleted, obj(2)));
        d.push_dedup(Delta::new(DeltaType::Added, obj(3)));
        d.push_dedup(Delta::new(DeltaType::Deleted, obj(4)));
        assert_eq!(d.len(), 4);
        assert_eq!(d.newest().map(|d| d.kind), Some(DeltaType::Deleted));
        assert_eq!(d.oldest().map(|d| d.kind), Some(DeltaType::Updated));
    }

    fn pushed(kinds: &[DeltaType], compact: bool) -> (Vec<(DeltaType, u32)>, Vec<bool>) {
        let mut list = DeltaList::new();
        let grew = kinds
            .iter()
            .enumerate()
            .map(|(v, &kind)| {
                let delta = Delta::new(kind, obj(v as u32));
                let predicted = push_grows(&list, kind, compact);
                let grew = push_delta(&mut list, delta, compact);
                assert_eq!(predicted, grew, "push_grows predicts push_delta");
                grew
            })
            .collect();
        let got = list
            .iter()
            .map(|d| (d.kind, **d.object.object().unwrap()))
            .collect();
        (got, grew)
    }

    #[test]
    fn compaction_replaces_a_newest_state_with_the_newer_one() {
        use DeltaType::*;
        for old in [Updated, Sync, Replaced] {
            for new in [Updated, Sync, Replaced] {
                let (list, grew) = pushed(&[old, new], true);
                assert_eq!(list, [(new, 1)], "{old} then {new}");
                assert_eq!(grew, [true, false]);
                // Off: both stay.
                assert_eq!(pushed(&[old, new], false).0, [(old, 0), (new, 1)]);
            }
        }
    }

    #[test]
    fn compaction_never_touches_added_or_deleted() {
        use DeltaType::*;
        for (kinds, kept) in [
            (&[Added, Updated][..], 2),
            (&[Updated, Added], 2),
            (&[Added, Added], 2),
            (&[Updated, Deleted, Updated], 3),
            (&[Deleted, Sync], 2),
        ] {
            assert_eq!(pushed(kinds, true).0.len(), kept, "{kinds:?}");
        }
        // Dedup still applies, and still keeps the older real delete.
        assert_eq!(pushed(&[Deleted, Deleted], true).0, [(Deleted, 0)]);
    }
}
