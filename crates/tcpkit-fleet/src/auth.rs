//! The barrier's key proof: tcpkit-keyfile's HMAC challenge-response under this channel's own
//! labels (so no proof of copy's control channel, nor one side's here, serves as another).
//! The barrier proves first, over both nonces: an agent holding another key learns so, by
//! name, before it says anything about itself. The agent's proof binds its shard and host
//! too, so an admitted claim cannot be changed on the path.

use tcpkit_keyfile::proof::{Key, Nonce, Tag};

use crate::wire::{Shard, VERSION};

const BARRIER_LABEL: &[u8] = b"tcpkit fleet barrier proof\0";
const AGENT_LABEL: &[u8] = b"tcpkit fleet agent proof\0";

/// The barrier's proof over both nonces.
pub fn barrier_proof(key: &Key, agent: &Nonce, barrier: &Nonce) -> Tag {
    key.proof(BARRIER_LABEL, &[&VERSION.to_be_bytes(), agent, barrier])
}

/// Whether `tag` is the barrier's proof of `key` (constant time).
pub fn verify_barrier(key: &Key, agent: &Nonce, barrier: &Nonce, tag: &Tag) -> bool {
    key.verify(
        BARRIER_LABEL,
        &[&VERSION.to_be_bytes(), agent, barrier],
        tag,
    )
}

fn claim(shard: Option<Shard>, host: &str) -> Vec<u8> {
    let (k, n) = shard.map_or((0, 0), |s| (s.index, s.count));
    let mut b = Vec::with_capacity(10 + host.len());
    b.extend_from_slice(&k.to_be_bytes());
    b.extend_from_slice(&n.to_be_bytes());
    b.extend_from_slice(&(host.len() as u16).to_be_bytes());
    b.extend_from_slice(host.as_bytes());
    b
}

/// The agent's proof over both nonces and its claim.
pub fn agent_proof(
    key: &Key,
    agent: &Nonce,
    barrier: &Nonce,
    shard: Option<Shard>,
    host: &str,
) -> Tag {
    let c = claim(shard, host);
    key.proof(AGENT_LABEL, &[&VERSION.to_be_bytes(), agent, barrier, &c])
}

/// Whether `tag` is the agent's proof of `key` over its claim (constant time).
pub fn verify_agent(
    key: &Key,
    agent: &Nonce,
    barrier: &Nonce,
    shard: Option<Shard>,
    host: &str,
    tag: &Tag,
) -> bool {
    let c = claim(shard, host);
    key.verify(
        AGENT_LABEL,
        &[&VERSION.to_be_bytes(), agent, barrier, &c],
        tag,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_proof_binds_its_side_and_the_agents_claim() {
        let k = Key::from_bytes(b"0123456789abcdef").unwrap();
        let (a, b) = ([1; 16], [2; 16]);
        let s = Some(Shard { index: 1, count: 3 });
        let bp = barrier_proof(&k, &a, &b);
        assert!(verify_barrier(&k, &a, &b, &bp));
        assert!(!verify_barrier(&k, &b, &a, &bp));
        let ap = agent_proof(&k, &a, &b, s, "h1");
        assert!(verify_agent(&k, &a, &b, s, "h1", &ap));
        assert!(!verify_agent(
            &k,
            &a,
            &b,
            Some(Shard { index: 2, count: 3 }),
            "h1",
            &ap
        ));
        assert!(!verify_agent(&k, &a, &b, s, "h2", &ap));
        assert!(!verify_agent(&k, &a, &b, None, "h1", &ap));
        // One side's proof never serves as the other's.
        assert!(!verify_barrier(&k, &a, &b, &ap));
        let other = Key::from_bytes(b"0123456789abcdeF").unwrap();
        assert!(!verify_barrier(&other, &a, &b, &bp));
    }
}
