//! What a write in this process just learned about a task, kept a short
//! while for the blocking call that usually follows it at once.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

/// Most entries kept at once.
pub(super) const CAPACITY: usize = 1024;
/// How long an entry is kept: the calls it serves follow its write at once.
const KEEP: Duration = Duration::from_secs(10);

type Key = (String, String);

/// Values by task (namespace, id), the oldest forgotten first. An entry may
/// go early (a task kept again after a take ages from its first keep),
/// never late.
#[derive(Debug)]
pub(super) struct Recent<V> {
    inner: Mutex<Kept<V>>,
}

#[derive(Debug)]
struct Kept<V> {
    values: HashMap<Key, V>,
    /// Keys in the order they were kept, with when.
    order: VecDeque<(Key, Instant)>,
}

impl<V> Default for Recent<V> {
    fn default() -> Self {
        Self { inner: Mutex::new(Kept { values: HashMap::new(), order: VecDeque::new() }) }
    }
}

impl<V> Recent<V> {
    /// Keeps `value` for the task, in place of any kept before.
    pub(super) fn keep(&self, namespace: &str, id: &str, value: V) {
        let now = Instant::now();
        let key = (namespace.to_owned(), id.to_owned());
        let mut kept = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some((_, at)) = kept.order.front()
            && (kept.order.len() >= CAPACITY || now.duration_since(*at) > KEEP)
        {
            if let Some((oldest, _)) = kept.order.pop_front() {
                kept.values.remove(&oldest);
            }
        }
        if kept.values.insert(key.clone(), value).is_none() {
            kept.order.push_back((key, now));
        }
    }

    /// A copy of the task's value, if one is kept.
    pub(super) fn get(&self, namespace: &str, id: &str) -> Option<V>
    where
        V: Clone,
    {
        let kept = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        kept.values.get(&(namespace.to_owned(), id.to_owned())).cloned()
    }

    /// The task's value, no longer kept.
    pub(super) fn take(&self, namespace: &str, id: &str) -> Option<V> {
        let mut kept = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        kept.values.remove(&(namespace.to_owned(), id.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_by_namespace_and_id_and_takes_once() {
        let recent = Recent::default();
        recent.keep("ns", "a", 1);
        recent.keep("ns", "a", 2);
        assert_eq!(recent.get("ns", "a"), Some(2), "a second keep replaces the first");
        assert_eq!(recent.get("other", "a"), None, "namespaces never mix");
        assert_eq!(recent.take("ns", "a"), Some(2));
        assert_eq!(recent.take("ns", "a"), None);
    }

    #[test]
    fn forgets_the_oldest_beyond_capacity() {
        let recent = Recent::default();
        for n in 0..=CAPACITY {
            recent.keep("ns", &format!("t{n}"), n);
        }
        assert_eq!(recent.get("ns", "t0"), None);
        assert_eq!(recent.get("ns", "t1"), Some(1));
        assert_eq!(recent.get("ns", &format!("t{CAPACITY}")), Some(CAPACITY));
    }
}
