//! The streams open in one process, by key: what a write looks through to
//! hand its result straight to a stream waiting for it (the hub's inbox
//! streams, the task store's claim streams). A stream is listed while its
//! [`Registration`] lives.

use std::{
    collections::HashMap,
    fmt,
    hash::Hash,
    sync::{Arc, Mutex, MutexGuard},
};

/// Open streams of type `T` by key. Cheap to clone: clones share the list.
pub struct Registry<K, T>(Arc<Mutex<HashMap<K, Vec<Arc<T>>>>>);

impl<K, T> Clone for Registry<K, T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<K, T> Default for Registry<K, T> {
    fn default() -> Self {
        Self(Arc::default())
    }
}

impl<K, T> fmt::Debug for Registry<K, T> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl<K: Eq + Hash + Clone, T> Registry<K, T> {
    /// Lists `live` under `key` until the registration is dropped.
    pub fn register(&self, key: K, live: T) -> Registration<K, T> {
        self.register_after(key, live, |_| {})
    }

    /// As [`register`](Self::register), once `before` has seen the streams
    /// listed under `key` so far, under the same lock: two registrations
    /// each see the other's only if it came first.
    pub fn register_after(&self, key: K, live: T, before: impl FnOnce(&[Arc<T>])) -> Registration<K, T> {
        let live = Arc::new(live);
        let mut streams = self.lock();
        let lives = streams.entry(key.clone()).or_default();
        before(lives);
        lives.push(Arc::clone(&live));
        Registration { registry: self.clone(), key, live }
    }

    /// The streams by key, locked while the guard lives.
    pub fn lock(&self) -> MutexGuard<'_, HashMap<K, Vec<Arc<T>>>> {
        self.0.lock().expect("stream registry lock poisoned")
    }
}

/// One stream's place in a [`Registry`]; dropping it takes the stream off.
pub struct Registration<K: Eq + Hash + Clone, T> {
    registry: Registry<K, T>,
    key: K,
    live: Arc<T>,
}

impl<K: Eq + Hash + Clone, T> Registration<K, T> {
    pub fn live(&self) -> &Arc<T> {
        &self.live
    }
}

impl<K: Eq + Hash + Clone, T> fmt::Debug for Registration<K, T> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_struct("Registration").finish_non_exhaustive()
    }
}

impl<K: Eq + Hash + Clone, T> Drop for Registration<K, T> {
    fn drop(&mut self) {
        let mut streams = self.registry.lock();
        if let Some(lives) = streams.get_mut(&self.key) {
            lives.retain(|live| !Arc::ptr_eq(live, &self.live));
            if lives.is_empty() {
                streams.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_listed_while_its_registration_lives() {
        let registry: Registry<&str, u32> = Registry::default();
        let first = registry.register("a", 1);
        let second = registry.register("a", 2);
        assert_eq!(registry.lock()["a"].iter().map(|live| **live).collect::<Vec<_>>(), [1, 2]);
        drop(first);
        assert_eq!(registry.lock()["a"].iter().map(|live| **live).collect::<Vec<_>>(), [2]);
        assert_eq!(**second.live(), 2);
        drop(second);
        assert!(registry.lock().is_empty(), "a key without streams goes");
    }

    #[test]
    fn a_registration_sees_the_streams_listed_before_it() {
        let registry: Registry<&str, u32> = Registry::default();
        let _first = registry.register("a", 1);
        let _other = registry.register("b", 9);
        let mut seen = Vec::new();
        let _second = registry.register_after("a", 2, |lives| seen.extend(lives.iter().map(|live| **live)));
        assert_eq!(seen, [1]);
    }
}
