//! What wrk's users type (issue 24, item 7): `tcpkit load http://HOST:PORT/PATH` with `-H`
//! headers, against nginx in lab host b: HTTP/1.1 GET with keep-alive over the connections,
//! and the answers counted by status, non-2xx/3xx said as wrk says it.

use crate::common;
use common::peer::{json, nginx_conf, pair, Pair, NGINX, SRV};

use std::time::Duration;

use common::{stderr, stdout};

const PORT: u16 = 8089;

/// nginx in the server host on PORT: `/need-header` answers 200 only to a request carrying
/// `X-Test: yes` (403 otherwise), and logs each request's Host header.
fn nginx(p: &mut Pair, dir: &std::path::Path) -> std::path::PathBuf {
    let log = dir.join("access.log");
    let conf = nginx_conf(
        dir,
        &format!(
            "log_format h '$http_host $http_x_test $status'; access_log {log} h;\n\
             server {{ listen {SRV}:{PORT};\n\
               location /need-header {{ if ($http_x_test != \"yes\") {{ return 403; }} return 200 \"ok\\n\"; }} }}",
            log = log.display()
        ),
    );
    p.server("nginx", &[NGINX, "-c", conf.to_str().unwrap()], PORT);
    log
}

#[test]
fn a_url_target_with_headers_loads_nginx_as_wrk_does() {
    let mut p = pair("ldwrk");
    let dir = tempfile::tempdir().unwrap();
    let log = nginx(&mut p, dir.path());
    let url = format!("http://{SRV}:{PORT}/need-header");
    let run = |extra: &[&str]| {
        let args = [
            &[url.as_str(), "-c", "2", "-r", "200", "-t", "1"][..],
            extra,
        ]
        .concat();
        p.load(&args, Duration::from_secs(20))
    };
    // With the header nginx asks for: every request answered 200 over the two connections
    // first opened (keep-alive), and the request's Host is the URL's.
    let o = run(&["-H", "X-Test: yes", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = json(&o);
    let answered = r["queries"]["answered"].as_u64().unwrap();
    assert!(answered >= 150, "{r:#}");
    assert_eq!(r["codes"], serde_json::json!({ "200": answered }), "{r:#}");
    assert_eq!(r["connections"]["attempts"], 2, "{r:#}");
    assert_eq!(r["payload"], "http GET /need-header", "{r:#}");
    let lines = std::fs::read_to_string(&log).unwrap();
    let want = format!("{SRV}:{PORT} yes 200");
    assert_eq!(
        lines.lines().filter(|l| *l == want).count() as u64,
        answered,
        "{lines}"
    );
    // Without it, every answer is 403: counted by status, and said as wrk says it.
    let o = run(&[]);
    let text = stdout(&o);
    assert!(text.contains("\nAnswers: HTTP 403: "), "{text}");
    assert!(text.contains("\nNon-2xx or 3xx responses: "), "{text}");
}
