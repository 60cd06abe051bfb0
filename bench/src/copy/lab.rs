//! The copy bench's lab (clients → online → target → assistant), built once for the copy
//! rows and for the soak's copy role.

use std::path::PathBuf;

use anyhow::Result;
use tcpkit_lab::{Host, Lab, LinkOpts, Proc};

use super::{
    nginx, Env, ASSIST, ASSIST_M, CLIENT, INTERCEPT_PORT, ONLINE, ONLINE_M, ONLINE_T, TARGET, TGT_A,
};

/// The lab every copy row runs in (see the module's doc): clients → online (nginx) → target
/// (nginx) → assistant, with the links the copy's own traffic crosses receiving in threads
/// of their own. Also the soak's copy role.
pub(crate) struct CopyLab {
    pub(crate) lab: Lab,
    pub(crate) env: Env,
    pub(crate) ast: Host,
    /// The assistant's end of the target's link, where intercept catches the answers.
    pub(crate) ast_if: String,
    pub(crate) online_nginx: Proc,
    pub(crate) target_nginx: Proc,
}

pub(crate) fn copy_lab(tag: &str, tcpkit: PathBuf) -> Result<CopyLab> {
    let mut lab = Lab::new(tag)?;
    let cli = lab.host("cli")?;
    let onl = lab.host("onl")?;
    let tgt = lab.host("tgt")?;
    let cli_link = lab.link(
        &cli,
        &onl,
        &LinkOpts::addrs(format!("{CLIENT}/24"), format!("{ONLINE}/24")),
    )?;
    // The links the copy's own traffic crosses receive in kernel threads of their own: on a
    // veth the receiving host's stack otherwise runs in the sender's syscalls, and the copy's
    // CPU would include the target's TCP stack (every handshake, request and FIN it takes in),
    // which on a real network runs on the target. The copy host's own receive path (the
    // target's answers, intercept's messages) is measured apart, from its threads.
    let tgt_link = lab.link(
        &onl,
        &tgt,
        &LinkOpts {
            rx_threads: true,
            ..LinkOpts::addrs(format!("{ONLINE_T}/24"), format!("{TARGET}/24"))
        },
    )?;
    for h in [&cli, &onl, &tgt] {
        // 20k new connections a second for seconds: the clients' ports and both servers'
        // SYN queues must hold them (the namespaces start with the kernel's defaults).
        h.sysctl("net.ipv4.ip_local_port_range", "10000 65000")?;
        h.sysctl("net.ipv4.tcp_tw_reuse", "1")?;
        h.sysctl("net.core.somaxconn", "4096")?;
        h.sysctl("net.ipv4.tcp_max_syn_backlog", "8192")?;
    }
    // Transparent mode: the target answers the clients' subnet through the assistant, where
    // intercept catches the answers; the copy reaches intercept over a link of its own.
    let ast = lab.host("ast")?;
    let ast_link = lab.link(
        &tgt,
        &ast,
        &LinkOpts {
            rx_threads: true,
            ..LinkOpts::addrs(format!("{TGT_A}/24"), format!("{ASSIST}/24"))
        },
    )?;
    let ctl_link = lab.link(
        &onl,
        &ast,
        &LinkOpts {
            rx_threads: true,
            ..LinkOpts::addrs(format!("{ONLINE_M}/24"), format!("{ASSIST_M}/24"))
        },
    )?;
    tgt.run(&["ip", "route", "add", "198.18.1.0/24", "via", ASSIST])?;
    for k in ["all", "default"] {
        // The clients' packets arrive from the online side: strict reverse-path filtering
        // would drop them.
        tgt.sysctl(&format!("net.ipv4.conf.{k}.rp_filter"), "0")?;
    }
    ast.sysctl("net.ipv4.ip_forward", "0")?;
    let (on, on_log) = nginx(&mut lab, &onl, ONLINE, "online", None)?;
    let (tg, tg_log) = nginx(&mut lab, &tgt, TARGET, "target", None)?;
    let rx_ifaces = vec![
        (onl.clone(), tgt_link.a.name.clone()),
        (tgt.clone(), tgt_link.b.name.clone()),
        (tgt.clone(), ast_link.a.name.clone()),
        (ast.clone(), ast_link.b.name.clone()),
        (onl.clone(), ctl_link.a.name.clone()),
        (ast.clone(), ctl_link.b.name.clone()),
    ];
    let env = Env {
        tcpkit,
        cli,
        onl,
        tgt: tgt.clone(),
        cap_if: cli_link.b.name.clone(),
        rx_ifaces,
        copy_rx: [tgt_link.a.rx_thread, ctl_link.a.rx_thread]
            .into_iter()
            .flatten()
            .collect(),
        on_log,
        tg_log,
        intercept: format!("{ASSIST_M}:{INTERCEPT_PORT}"),
        intercept_on_target: format!("{TARGET}:{INTERCEPT_PORT}"),
    };
    let ast_if = ast_link.b.name.clone();
    Ok(CopyLab {
        lab,
        env,
        ast,
        ast_if,
        online_nginx: on,
        target_nginx: tg,
    })
}
