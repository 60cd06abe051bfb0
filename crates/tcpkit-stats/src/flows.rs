//! Flow counting as tcpreplay does it: a flow is new the first time its (direction-specific)
//! key is seen, or again after it was idle longer than the expiry; packets without a key are
//! "non-flow" packets.

use std::collections::HashMap;
use std::hash::Hash;

/// Keyed by the exact key, never a lossy hash (STYLE.md: collisions would merge flows).
#[derive(Debug)]
pub struct FlowTable<K> {
    last_seen: HashMap<K, u64>,
    expiry_ns: Option<u64>,
    pub flows: u64,
    pub flow_packets: u64,
    pub non_flow_packets: u64,
    /// Flows that were seen before but had expired (counted in `flows` too).
    pub expired: u64,
}

impl<K: Hash + Eq> FlowTable<K> {
    /// `expiry_ns`: a flow idle longer than this (in capture time) counts as a new flow when it
    /// comes back; `None` means flows never expire (tcpreplay's default).
    pub fn new(expiry_ns: Option<u64>) -> Self {
        FlowTable {
            last_seen: HashMap::new(),
            expiry_ns,
            flows: 0,
            flow_packets: 0,
            non_flow_packets: 0,
            expired: 0,
        }
    }

    /// Counts one packet; returns true when it starts a new flow.
    pub fn observe(&mut self, key: Option<K>, ts_ns: u64) -> bool {
        let Some(key) = key else {
            self.non_flow_packets += 1;
            return false;
        };
        self.flow_packets += 1;
        match self.last_seen.get_mut(&key) {
            Some(last) => {
                let idle = ts_ns.saturating_sub(*last);
                *last = ts_ns;
                match self.expiry_ns {
                    Some(exp) if idle > exp => {
                        self.flows += 1;
                        self.expired += 1;
                        true
                    }
                    _ => false,
                }
            }
            None => {
                self.last_seen.insert(key, ts_ns);
                self.flows += 1;
                true
            }
        }
    }

    /// Distinct keys held (memory grows with this, not with packets).
    pub fn distinct(&self) -> usize {
        self.last_seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_new_flows_and_non_flow() {
        let mut t = FlowTable::new(None);
        assert!(t.observe(Some(1u32), 0));
        assert!(!t.observe(Some(1), 10));
        assert!(t.observe(Some(2), 20));
        assert!(!t.observe(None, 30));
        assert_eq!((t.flows, t.flow_packets, t.non_flow_packets), (2, 3, 1));
    }

    #[test]
    fn expiry_makes_flows_new_again() {
        let mut t = FlowTable::new(Some(1_000));
        assert!(t.observe(Some(7u8), 0));
        assert!(!t.observe(Some(7), 1_000));
        assert!(t.observe(Some(7), 2_001));
        assert_eq!((t.flows, t.expired), (2, 1));
    }
}
