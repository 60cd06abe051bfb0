//! Body of the `rewrite` fuzz target, public so a stable test runs it over the seed corpus.

use crate::{
    flow_key, flow_shard, shard_hash, to_ethernet, unique_ip, LinkType, MacAddr, RewriteConfig,
    Rewriter,
};
use crate::{IpMap, PortMap, TtlEdit, VlanEdit};

/// Byte 0 picks the edits (one bit each), byte 1 the link type, bytes 2-3 the MTU and the
/// unique-ip loop; the rest is the captured frame. Must never panic.
pub fn fuzz_rewrite(data: &[u8]) {
    let [flags, link, mtu, lp, frame @ ..] = data else {
        return;
    };
    let bit = |n: u8| flags & (1 << n) != 0;
    let links = [
        LinkType::Ethernet,
        LinkType::Null,
        LinkType::Raw,
        LinkType::Loop,
        LinkType::LinuxSll,
        LinkType::Ipv4,
        LinkType::Ipv6,
        LinkType::LinuxSll2,
    ];
    let link = links[usize::from(*link) % links.len()];
    let map = |s: &str| s.parse::<IpMap>().ok().into_iter().collect::<Vec<_>>();
    let cfg = RewriteConfig {
        src_mac: bit(0).then_some(MacAddr([2, 0, 0, 0, 0, 1])),
        dst_mac: bit(0).then_some(MacAddr::BROADCAST),
        srcipmap: if bit(1) {
            map("0.0.0.0/0:10.0.0.0/8")
        } else {
            map("[::/0]:[2001:db8::/32]")
        },
        dstipmap: if bit(2) {
            map("10.0.0.0/8:192.168.0.0/16")
        } else {
            Vec::new()
        },
        portmap: bit(3)
            .then(|| "0-1023:8080,8080:80".parse::<PortMap>().ok())
            .flatten(),
        mtu_trunc: bit(4).then_some(u16::from(*mtu)),
        fixcsum: bit(5),
        vlan: match (bit(6), bit(7)) {
            (true, false) => Some(VlanEdit::Add {
                vid: u16::from(*mtu) * 16,
                pcp: *lp,
                cfi: lp & 1 == 1,
            }),
            (true, true) => Some(VlanEdit::Remove),
            (false, _) => None,
        },
        ttl: bit(7).then_some(TtlEdit::Decrease(*lp)),
    };
    let rw = Rewriter::new(cfg);
    let mut buf = Vec::with_capacity(frame.len() + 64);
    if to_ethernet(
        link,
        frame,
        MacAddr([2, 0, 0, 0, 0, 2]),
        MacAddr::BROADCAST,
        &mut buf,
    )
    .is_err()
    {
        buf.clear();
        buf.extend_from_slice(frame);
    }
    let _ = rw.apply(&mut buf);
    unique_ip(&mut buf, u32::from(*lp));
    let _ = flow_key(&buf);
    let _ = shard_hash(&buf);
    let n = flow_shard(&buf, u32::from(*lp) + 1);
    assert!((1..=u32::from(*lp) + 1).contains(&n));
}
