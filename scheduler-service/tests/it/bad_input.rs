//! Every bad input of issue 12 gets its status; random bytes and random
//! protobuf messages get an error, never a panic, and the server keeps
//! serving with its state intact.

use proptest::prelude::*;
use prost::Message;
use tensile_proto::convert::graph_to_proto;
use tensile_proto::pb;
use tonic::Code;

use crate::util::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_input_gets_its_status() {
    let mut cfg = config();
    cfg.admin_token = Some("sesame".into());
    cfg.limits.max_ops = 200;
    let s = tcp(cfg).await;
    let mut c = connect(&s.address).await;
    let g = mlp(64);
    let r = register(&mut c, "ok", &g).await;
    let ops = g.ops().len();

    // A malformed graph: the op at fault is named.
    let mut bad = graph_to_proto(&g);
    bad.ops[3].inputs.push(99_999);
    let e = c
        .register_job(pb::RegisterJobRequest {
            graph: Some(bad),
            ..register_req("x", &g)
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("op 3"), "{}", e.message());
    let mut bad = graph_to_proto(&g);
    bad.tensors[2].bytes += 1;
    let e = c
        .register_job(pb::RegisterJobRequest {
            graph: Some(bad),
            ..register_req("x", &g)
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("tensor 2"), "{}", e.message());
    let e = c
        .register_job(pb::RegisterJobRequest {
            graph: None,
            ..register_req("x", &g)
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // Over the limits (200 ops here).
    let big =
        tensile_graph::zoo::build("resnet50", &tensile_graph::zoo::ZooConfig::new(1)).unwrap();
    let e = c.register_job(register_req("big", &big)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("over the limit of 200"),
        "{}",
        e.message()
    );

    // Tokens.
    let mut rep = report(&r, ops, 1e-3);
    rep.token = String::new();
    assert_eq!(
        c.report_latencies(rep).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    let mut rep = report(&r, ops, 1e-3);
    rep.token = "0".repeat(32);
    assert_eq!(
        c.report_latencies(rep).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    let e = c
        .subscribe_plans(pb::SubscribePlansRequest {
            job_id: r.job_id,
            token: "nope".into(),
            after_version: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = c
        .unregister_job(pb::UnregisterJobRequest {
            job_id: 4242,
            token: r.token.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(
        c.get_status(pb::GetStatusRequest { job_id: 4242 })
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );

    // Latencies: wrong count, NaN, negative.
    let e = c
        .report_latencies(report(&r, ops - 1, 1e-3))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains(&format!("the graph has {ops} ops")),
        "{}",
        e.message()
    );
    for v in [f64::NAN, -1.0, f64::INFINITY] {
        let mut rep = report(&r, ops, 1e-3);
        rep.op_latency_s[5] = v;
        let e = c.report_latencies(rep).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("op_latency_s[5]"), "{}", e.message());
    }
    let mut rep = report(&r, ops, 1e-3);
    rep.late_prefetches = vec![u32::MAX];
    assert_eq!(
        c.report_latencies(rep).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    // The admin token.
    let budget = |t: &str| pb::SetMemoryBudgetRequest {
        budget_bytes: 1 << 30,
        admin_token: t.into(),
    };
    assert_eq!(
        c.set_memory_budget(budget("")).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    assert_eq!(
        c.set_memory_budget(budget("open"))
            .await
            .unwrap_err()
            .code(),
        Code::PermissionDenied
    );
    c.set_memory_budget(budget("sesame")).await.unwrap();

    // None of it disturbed the job.
    let st = status(&mut c).await;
    assert_eq!(st.jobs.len(), 1);
    assert_eq!(st.memory.unwrap().budget_bytes, 1 << 30);
    c.report_latencies(report(&r, ops, 1e-3)).await.unwrap();
    s.stop().await;
}

/// Every number off the wire has a range: out of it, INVALID_ARGUMENT
/// naming the field. At the edge of the ranges (one job reporting an
/// iteration of a day), planning still answers the others at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_numbers_are_refused_and_the_worst_valid_report_stalls_no_one() {
    let s = tcp(config()).await;
    let mut c = connect(&s.address).await;
    let g = mlp(64);
    let ops = g.ops().len();
    let r = register(&mut c, "hostile", &g).await;
    let refused = |e: tonic::Status, field: &str| {
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(field), "{}", e.message());
    };

    // A year per op; a day's worth of hours; a stall of a year.
    refused(
        c.report_latencies(report(&r, ops, 3.2e7))
            .await
            .unwrap_err(),
        "op_latency_s[0]",
    );
    refused(
        c.report_latencies(report(&r, ops, 3599.0))
            .await
            .unwrap_err(),
        "adds up to",
    );
    let mut rep = report(&r, ops, 1e-3);
    rep.stall_s = 3.2e7;
    refused(c.report_latencies(rep).await.unwrap_err(), "stall_s");
    // The same at registration, and absurd settings, names and budgets.
    let mut req = register_req("x", &g);
    req.op_latency_s = vec![3.2e7; ops];
    refused(c.register_job(req).await.unwrap_err(), "op_latency_s[0]");
    let mut req = register_req("x", &g);
    req.settings = Some(pb::JobSettings {
        base_bytes: u64::MAX,
        ..Default::default()
    });
    refused(
        c.register_job(req).await.unwrap_err(),
        "settings.base_bytes",
    );
    let req = register_req(&"x".repeat(5 << 20), &g);
    refused(c.register_job(req).await.unwrap_err(), "name has");
    let e = c
        .set_memory_budget(pb::SetMemoryBudgetRequest {
            budget_bytes: u64::MAX,
            admin_token: String::new(),
        })
        .await
        .unwrap_err();
    refused(e, "budget_bytes");
    let e = c
        .plan_graph(pb::PlanGraphRequest {
            graph: Some(tensile_proto::convert::graph_to_proto(&g)),
            device: Some(pb::DeviceProfile {
                name: "a6000".into(),
                h2d_bytes_per_s: 1e-300,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    refused(e, "device.h2d_bytes_per_s");

    // The worst valid report: an iteration of a day. Another job's
    // registration is planned, and a budget change answers, at once.
    let day = 86_400.0 / ops as f64;
    c.report_latencies(report(&r, ops, day)).await.unwrap();
    let t = std::time::Instant::now();
    let other = register(&mut c, "well-behaved", &g).await;
    let mut plans = subscribe(&mut c, &other).await;
    next_plan(&mut plans).await;
    c.set_memory_budget(pb::SetMemoryBudgetRequest {
        budget_bytes: 1 << 30,
        admin_token: String::new(),
    })
    .await
    .unwrap();
    c.report_latencies(report(&other, ops, 1e-3)).await.unwrap();
    let took = t.elapsed();
    assert!(
        took < std::time::Duration::from_secs(10),
        "planning was held up for {took:?} by one job's day-long iteration"
    );
    s.stop().await;
}

/// One server for all cases: its state must survive them all.
fn fuzz_server() -> &'static (
    tokio::runtime::Runtime,
    String,
    pb::RegisterJobResponse,
    usize,
) {
    static S: std::sync::OnceLock<(
        tokio::runtime::Runtime,
        String,
        pb::RegisterJobResponse,
        usize,
    )> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (addr, r, ops) = rt.block_on(async {
            let s = tcp(config()).await;
            let addr = s.address.clone();
            std::mem::forget(s); // lives for the test binary
            let mut c = connect(&addr).await;
            let g = mlp(64);
            (addr, register(&mut c, "kept", &g).await, g.ops().len())
        });
        (rt, addr, r, ops)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: fuzz_cases(48), ..ProptestConfig::default() })]

    #[test]
    fn random_messages_get_an_error_never_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..16)) {
        let (rt, addr, r, ops) = fuzz_server();
        rt.block_on(async {
            let mut c = connect(addr).await;
            // Random bytes read as each request type (what the server would
            // decode from them), sent: an answer, never a crash.
            if let Ok(m) = pb::RegisterJobRequest::decode(bytes.as_slice()) {
                let _ = c.register_job(m).await;
            }
            if let Ok(mut m) = pb::ReportLatenciesRequest::decode(bytes.as_slice()) {
                m.job_id = r.job_id;
                let e = c.report_latencies(m).await.unwrap_err();
                assert!(matches!(e.code(), Code::InvalidArgument | Code::PermissionDenied | Code::Unauthenticated), "{e:?}");
            }
            if let Ok(m) = pb::PlanGraphRequest::decode(bytes.as_slice()) {
                let _ = c.plan_graph(m).await;
            }
            // A valid registration with random bytes flipped.
            let mut enc = register_req("flip", &mlp(64)).encode_to_vec();
            for (at, x) in &flips {
                let n = enc.len();
                enc[at % n] ^= x;
            }
            if let Ok(m) = pb::RegisterJobRequest::decode(enc.as_slice())
                && let Ok(a) = c.register_job(m).await
            {
                c.unregister_job(pb::UnregisterJobRequest { job_id: a.get_ref().job_id, token: a.get_ref().token.clone() }).await.unwrap();
            }
            // Raw garbage on the socket (not even HTTP/2).
            if let Ok(mut raw) = tokio::net::TcpStream::connect(addr.as_str()).await {
                use tokio::io::AsyncWriteExt;
                let _ = raw.write_all(&bytes).await;
            }
            // Still serving, the kept job intact.
            let st = c.get_status(pb::GetStatusRequest { job_id: r.job_id }).await.unwrap().into_inner();
            assert_eq!(st.jobs.len(), 1);
            c.report_latencies(report(r, *ops, 1e-3)).await.unwrap();
        });
    }
}

/// Proptest cases for the fuzzers: `default` in CI, `TENSILE_FUZZ_CASES`
/// for a longer run by hand.
fn fuzz_cases(default: u32) -> u32 {
    std::env::var("TENSILE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One step of a random client: what it calls, with which numbers.
#[derive(Debug, Clone)]
enum Step {
    Register {
        width: u64,
        base_bytes: u64,
    },
    Report {
        job: usize,
        each_s: f64,
        stall_s: f64,
        late: u32,
    },
    Heartbeat {
        job: usize,
        good_token: bool,
    },
    Budget(u64),
    Unregister {
        job: usize,
        good_token: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let seconds = prop_oneof![
        Just(0.0),
        1e-6..1e-1f64,
        Just(3600.0),
        Just(1e12),
        Just(f64::NAN),
        Just(-1.0),
    ];
    prop_oneof![
        (
            prop_oneof![Just(16u64), Just(64), Just(256)],
            prop_oneof![Just(0u64), Just(1 << 20), Just(1 << 50), Just(u64::MAX)]
        )
            .prop_map(|(width, base_bytes)| Step::Register { width, base_bytes }),
        (0..4usize, seconds.clone(), seconds, 0..100u32).prop_map(
            |(job, each_s, stall_s, late)| Step::Report {
                job,
                each_s,
                stall_s,
                late
            }
        ),
        (0..4usize, any::<bool>())
            .prop_map(|(job, good_token)| Step::Heartbeat { job, good_token }),
        prop_oneof![Just(1u64), Just(1 << 28), Just(1 << 33), Just(u64::MAX)]
            .prop_map(Step::Budget),
        (0..4usize, any::<bool>())
            .prop_map(|(job, good_token)| Step::Unregister { job, good_token }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: fuzz_cases(16), ..ProptestConfig::default() })]

    /// Random sequences of calls with random numbers (absurd ones too) and
    /// tokens: every call answers within 10 s, and after each step the
    /// server still serves and a well-behaved job is still there, its
    /// reports taken.
    #[test]
    fn random_call_sequences_leave_the_server_serving(steps in proptest::collection::vec(step(), 1..10)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            let s = tcp(config()).await;
            let mut c = connect(&s.address).await;
            let kept_graph = mlp(32);
            let kept = register(&mut c, "kept", &kept_graph).await;
            let mut kept_plans = subscribe(&mut c, &kept).await;
            next_plan(&mut kept_plans).await;
            let mut jobs: Vec<(pb::RegisterJobResponse, usize)> = Vec::new();
            for st in &steps {
                let answered = tokio::time::timeout(std::time::Duration::from_secs(10), async {
                    match st {
                        Step::Register { width, base_bytes } => {
                            let g = mlp(*width);
                            let mut req = register_req("random", &g);
                            req.settings = Some(pb::JobSettings { base_bytes: *base_bytes, ..Default::default() });
                            if let Ok(r) = c.register_job(req).await {
                                jobs.push((r.into_inner(), g.ops().len()));
                            }
                        }
                        Step::Report { job, each_s, stall_s, late } => {
                            if let Some((r, ops)) = jobs.get(*job) {
                                let mut rep = report(r, *ops, *each_s);
                                rep.stall_s = *stall_s;
                                rep.late_prefetches = vec![*late];
                                let _ = c.report_latencies(rep).await;
                            }
                        }
                        Step::Heartbeat { job, good_token } => {
                            if let Some((r, _)) = jobs.get(*job) {
                                let token = if *good_token { r.token.clone() } else { "x".repeat(32) };
                                let _ = c.heartbeat(pb::HeartbeatRequest { job_id: r.job_id, token }).await;
                            }
                        }
                        Step::Budget(bytes) => {
                            let _ = c.set_memory_budget(pb::SetMemoryBudgetRequest { budget_bytes: *bytes, admin_token: String::new() }).await;
                        }
                        Step::Unregister { job, good_token } => {
                            if let Some((r, _)) = jobs.get(*job) {
                                let token = if *good_token { r.token.clone() } else { "y".repeat(32) };
                                let _ = c.unregister_job(pb::UnregisterJobRequest { job_id: r.job_id, token }).await;
                            }
                        }
                    }
                    // The invariants: the server answers, the kept job is
                    // there and its report is taken.
                    let st = c.get_status(pb::GetStatusRequest { job_id: kept.job_id }).await.unwrap().into_inner();
                    assert_eq!(st.jobs.len(), 1, "the kept job is gone after {st:?}");
                    assert!(st.jobs[0].plan_version >= 1, "the kept job lost its plan: {st:?}");
                    c.report_latencies(report(&kept, kept_graph.ops().len(), 1e-3)).await.unwrap();
                })
                .await;
                assert!(answered.is_ok(), "no answer within 10 s after {st:?}");
            }
            s.stop().await;
        });
    }
}
