//! Locks that outlive a panic under them. Every `std::sync` lock in coloc guards data that
//! each change leaves whole (a value swapped in, a sample pushed), so a lock poisoned by a
//! panicking holder still guards consistent data: readers and writers go on with it
//! rather than spreading the panic.

use std::sync::{LockResult, PoisonError};

/// The guard (or value) of a lock result, poisoned or not: `mutex.lock().unpoisoned()`,
/// `rwlock.read().unpoisoned()`, `mutex.into_inner().unpoisoned()`.
pub trait Unpoisoned<T> {
    fn unpoisoned(self) -> T;
}

impl<T> Unpoisoned<T> for LockResult<T> {
    fn unpoisoned(self) -> T {
        self.unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn a_lock_poisoned_by_a_panic_still_gives_its_data() {
        let shared = Arc::new(Mutex::new(1));
        let holder = Arc::clone(&shared);
        let panicked = std::thread::spawn(move || {
            let mut guard = holder.lock().unwrap();
            *guard = 2;
            panic!("a panic under the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(shared.is_poisoned());
        assert_eq!(*shared.lock().unpoisoned(), 2);
        let shared = Arc::into_inner(shared).unwrap();
        assert_eq!(shared.into_inner().unpoisoned(), 2);
    }
}
