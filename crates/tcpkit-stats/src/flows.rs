//! Flow counting as tcpreplay does it: a flow is new the first time its (direction-specific)
//! key is seen, or again after it was idle longer than the expiry; packets without a key are
//! "non-flow" packets. Connections come from the same table: a new flow whose reverse is not
//! already live opens a connection.
//!
//! This runs once per packet at top speed, so the table is keyed by the exact key (never a
//! lossy hash: collisions would merge flows) but hashed with a fast non-cryptographic hash,
//! and one lookup serves both counts.

use std::hash::Hash;

use rustc_hash::FxHashMap;

/// tcpreplay's flow table over one stream of packets: counts flows, connections and packets
/// with and without a key, in one lookup per packet.
#[derive(Debug)]
pub struct FlowTable<K> {
    last_seen: FxHashMap<K, u64>,
    expiry_ns: Option<u64>,
    /// Flows started: keys never seen, or seen again after idling past the expiry.
    pub flows: u64,
    /// Connections opened: new flows whose reverse direction was not live.
    pub connections: u64,
    /// Packets that had a key.
    pub flow_packets: u64,
    /// Packets without a key.
    pub non_flow_packets: u64,
    /// Flows that were seen before but had expired (counted in `flows` too).
    pub expired: u64,
}

impl<K: Hash + Eq + Copy> FlowTable<K> {
    /// `expiry_ns`: a flow idle longer than this counts as a new flow when it comes back;
    /// `None` means flows never expire (tcpreplay's default).
    pub fn new(expiry_ns: Option<u64>) -> Self {
        let mut last_seen = FxHashMap::default();
        // Most captures have a few thousand flows; start there instead of growing through
        // a dozen rehashes on the hot path.
        last_seen.reserve(4096);
        FlowTable {
            last_seen,
            expiry_ns,
            flows: 0,
            connections: 0,
            flow_packets: 0,
            non_flow_packets: 0,
            expired: 0,
        }
    }

    fn fresh(&self, last: u64, ts_ns: u64) -> bool {
        match self.expiry_ns {
            Some(exp) => ts_ns.saturating_sub(last) <= exp,
            None => true,
        }
    }

    /// Counts one packet with its key and its reverse's key; returns true when it starts a new
    /// flow.
    pub fn observe(&mut self, key: Option<(K, K)>, ts_ns: u64) -> bool {
        let Some((key, rev)) = key else {
            self.non_flow_packets += 1;
            return false;
        };
        self.flow_packets += 1;
        let new = match self.last_seen.get(&key).copied() {
            Some(last) if self.fresh(last, ts_ns) => false,
            Some(_) => {
                self.expired += 1;
                true
            }
            None => true,
        };
        if new {
            self.flows += 1;
            let reverse_live = key != rev
                && self
                    .last_seen
                    .get(&rev)
                    .is_some_and(|&last| self.fresh(last, ts_ns));
            if !reverse_live {
                self.connections += 1;
            }
        }
        self.last_seen.insert(key, ts_ns);
        new
    }

    /// Distinct keys held (memory grows with this, not with packets).
    pub fn distinct(&self) -> usize {
        self.last_seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(a: u8, b: u8) -> Option<(u16, u16)> {
        let (a, b) = (u16::from(a), u16::from(b));
        Some((a << 8 | b, b << 8 | a))
    }

    #[test]
    fn counts_flows_connections_and_non_flow() {
        let mut t = FlowTable::new(None);
        assert!(t.observe(k(1, 2), 0));
        assert!(!t.observe(k(1, 2), 10));
        assert!(t.observe(k(2, 1), 15), "the reverse is a flow of its own");
        assert!(t.observe(k(3, 4), 20));
        assert!(!t.observe(None, 30));
        assert_eq!(
            (t.flows, t.connections, t.flow_packets, t.non_flow_packets),
            (3, 2, 4, 1)
        );
    }

    #[test]
    fn expiry_makes_flows_and_connections_new_again() {
        let mut t = FlowTable::new(Some(1_000));
        assert!(t.observe(k(7, 8), 0));
        assert!(!t.observe(k(7, 8), 1_000));
        assert!(t.observe(k(7, 8), 2_001));
        assert_eq!((t.flows, t.expired, t.connections), (2, 1, 2));
        // The reverse, seen while its forward flow is live, joins the connection.
        assert!(t.observe(k(8, 7), 2_500));
        assert_eq!(t.connections, 2);
    }

    #[test]
    fn a_flow_that_is_its_own_reverse_is_one_connection() {
        let mut t = FlowTable::new(None);
        assert!(t.observe(Some((5u8, 5u8)), 0));
        assert_eq!(t.connections, 1);
    }
}
