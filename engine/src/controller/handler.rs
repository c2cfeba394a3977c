//! The event handlers a controller registers on its informers: each turns a notification
//! into adds of primary keys, at low priority when nothing changed (an object of the initial
//! list, a resync), at normal priority otherwise.

use std::fmt;
use std::sync::Arc;

use crate::consumer::EventHandler;
use crate::delta::DeltaObject;
use crate::informer::Versioned;
use crate::key::{Key, KeyFn};

use super::mapping::Mapper;
use super::queue::{ControllerQueue, Priority, LOW_PRIORITY, NORMAL_PRIORITY};

/// A notification of the primary informer, as an event filter sees it.
#[derive(Debug)]
pub enum Event<'a, K> {
    /// An object appeared; `initial` when it came with the informer's initial list.
    Add {
        /// The object.
        object: &'a Arc<K>,
        /// It came with the informer's initial list.
        initial: bool,
    },
    /// An object changed (or was resynced: then `old` and `new` have the same resource version).
    Update {
        /// The state before.
        old: &'a Arc<K>,
        /// The state now.
        new: &'a Arc<K>,
    },
    /// An object was deleted (the payload may be a tombstone).
    Delete(&'a DeltaObject<K>),
}

/// Decides whether a primary notification enqueues its key (controller-runtime's
/// predicates): true to enqueue. It runs on the handler's delivery thread, before the add.
pub type EventFilter<K> = Arc<dyn Fn(&Event<'_, K>) -> bool + Send + Sync>;

/// The priorities a handler gives its adds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Priorities {
    /// For objects of the initial list and for resyncs.
    pub(crate) unchanged: Priority,
}

impl Priorities {
    pub(crate) fn new(low_when_unchanged: bool) -> Self {
        Self {
            unchanged: if low_when_unchanged {
                LOW_PRIORITY
            } else {
                NORMAL_PRIORITY
            },
        }
    }

    fn of_add(self, initial: bool) -> Priority {
        if initial {
            self.unchanged
        } else {
            NORMAL_PRIORITY
        }
    }

    fn of_update<K: Versioned>(self, old: &K, new: &K) -> Priority {
        if old.resource_version() == new.resource_version() {
            self.unchanged
        } else {
            NORMAL_PRIORITY
        }
    }
}

/// The primary informer's handler: the object's own key.
pub(crate) struct EnqueuePrimary<K> {
    pub(crate) queue: Arc<dyn ControllerQueue>,
    pub(crate) key_fn: KeyFn<K>,
    pub(crate) filter: Option<EventFilter<K>>,
    pub(crate) priorities: Priorities,
}

impl<K> EnqueuePrimary<K> {
    fn passes(&self, event: &Event<'_, K>) -> bool {
        self.filter.as_ref().is_none_or(|filter| filter(event))
    }

    fn add(&self, obj: &K, priority: Priority) {
        // An object without a key cannot be stored by the informer either; nothing to do.
        if let Ok(key) = (self.key_fn)(obj) {
            self.queue.add_with_priority(key, priority);
        }
    }
}

impl<K: Versioned> EventHandler<K> for EnqueuePrimary<K> {
    fn on_add(&mut self, object: &Arc<K>, initial: bool) {
        if self.passes(&Event::Add { object, initial }) {
            self.add(object, self.priorities.of_add(initial));
        }
    }

    fn on_update(&mut self, old: &Arc<K>, new: &Arc<K>) {
        if self.passes(&Event::Update { old, new }) {
            self.add(new, self.priorities.of_update(&**old, &**new));
        }
    }

    fn on_delete(&mut self, obj: &DeltaObject<K>) {
        if !self.passes(&Event::Delete(obj)) {
            return;
        }
        match obj {
            DeltaObject::Object(o) => self.add(o, NORMAL_PRIORITY),
            DeltaObject::Tombstone(t) => {
                self.queue.add_with_priority(t.key.clone(), NORMAL_PRIORITY)
            }
        }
    }
}

impl<K> fmt::Debug for EnqueuePrimary<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnqueuePrimary")
            .field("priorities", &self.priorities)
            .finish_non_exhaustive()
    }
}

/// A secondary informer's handler: the primary keys its objects map to.
pub(crate) struct EnqueueMapped<S> {
    pub(crate) queue: Arc<dyn ControllerQueue>,
    pub(crate) mapper: Mapper<S>,
    pub(crate) priorities: Priorities,
}

impl<S> EnqueueMapped<S> {
    fn add(&self, keys: Vec<Key>, priority: Priority) {
        for key in keys {
            self.queue.add_with_priority(key, priority);
        }
    }
}

impl<S: Versioned> EventHandler<S> for EnqueueMapped<S> {
    fn on_add(&mut self, obj: &Arc<S>, initial: bool) {
        self.add((self.mapper)(obj), self.priorities.of_add(initial));
    }

    fn on_update(&mut self, old: &Arc<S>, new: &Arc<S>) {
        let priority = self.priorities.of_update(&**old, &**new);
        // Both: an object that changed owners concerns the old owner as well as the new.
        let mut keys = (self.mapper)(new);
        for key in (self.mapper)(old) {
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        self.add(keys, priority);
    }

    fn on_delete(&mut self, obj: &DeltaObject<S>) {
        let last = match obj {
            DeltaObject::Object(o) => Some(o),
            DeltaObject::Tombstone(t) => t.last_known.as_ref(),
        };
        if let Some(last) = last {
            self.add((self.mapper)(last), NORMAL_PRIORITY);
        }
    }
}

impl<S> fmt::Debug for EnqueueMapped<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnqueueMapped")
            .field("priorities", &self.priorities)
            .finish_non_exhaustive()
    }
}
