//! Every RPC's happy path over TCP and over a Unix socket.

use tensile_proto::convert::plan_from_proto;
use tensile_proto::pb;

use crate::util::*;

async fn register_plan_report_unregister(address: &str) {
    let mut c = connect(address).await;
    let g = mlp(256);
    let r = register(&mut c, "first", &g).await;
    // Admitted: planning, or planned already (small graphs plan fast).
    assert!(
        [pb::JobState::Planning as i32, pb::JobState::Active as i32].contains(&r.state),
        "{r:?}"
    );
    assert_eq!(r.token.len(), 32);
    assert_eq!(r.lease_s, 10.0);
    let mut plans = subscribe(&mut c, &r).await;
    let p1 = next_plan(&mut plans).await;
    assert_eq!((p1.job_id, p1.version), (r.job_id, 1));
    // The plan is one for this graph.
    let plan = plan_from_proto(&p1, &g).unwrap();
    assert!(!plan.events.is_empty());

    // The first report re-plans (the cold start was a prediction).
    let ops = g.ops().len();
    let a = c
        .report_latencies(report(&r, ops, 1e-3))
        .await
        .unwrap()
        .into_inner();
    assert!(a.replanned, "{a:?}");
    assert!(a.change_rate > 0.0);
    assert_eq!(next_plan(&mut plans).await.version, 2);
    // The same again: a small change (the EWMA still holds a tenth of the
    // prediction), under the threshold: no re-plan.
    let a = c
        .report_latencies(report(&r, ops, 1e-3))
        .await
        .unwrap()
        .into_inner();
    assert!(!a.replanned && a.change_rate < 0.3, "{a:?}");
    assert_eq!(a.plan_version, 2);
    // Ten times slower: past the threshold.
    let a = c
        .report_latencies(report(&r, ops, 1e-2))
        .await
        .unwrap()
        .into_inner();
    assert!(a.replanned && a.change_rate > 5.0, "{a:?}");
    assert_eq!(next_plan(&mut plans).await.version, 3);

    let hb = c
        .heartbeat(pb::HeartbeatRequest {
            job_id: r.job_id,
            token: r.token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hb.state, pb::JobState::Active as i32);
    assert_eq!(hb.plan_version, 3);

    let st = status(&mut c).await;
    assert_eq!(st.device, "a6000");
    let j = &st.jobs[0];
    assert_eq!(
        (j.job_id, j.plan_version, j.iterations_reported),
        (r.job_id, 3, 3)
    );
    assert_eq!(j.reported_peak_bytes, 1234);
    // Reported latencies replace the cold start's.
    assert_eq!(j.latency_source, "measured");
    let mem = st.memory.unwrap();
    assert!(mem.sum_of_peaks_bytes > 0 && mem.sum_of_peaks_bytes <= mem.vanilla_sum_of_peaks_bytes);
    // The job's base: the profile's, until a report measures one that
    // differs materially.
    assert_eq!(
        (j.base_bytes, j.base_source.as_str(), j.reported_base_bytes),
        (536_870_912, "profile", 0)
    );
    let lower_bound = j.lower_bound_bytes;
    // A figure past the device's memory is no measurement: refused, named.
    let bad = pb::ReportLatenciesRequest {
        base_bytes: u64::MAX,
        ..report(&r, ops, 1e-3)
    };
    let e = c.report_latencies(bad).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("base_bytes is 18446744073709551615"),
        "{e:?}"
    );
    // Measured 1 GB over the profile's: planned with at once.
    let measured = 536_870_912 + 1_000_000_000;
    let a = c
        .report_latencies(pb::ReportLatenciesRequest {
            base_bytes: measured,
            ..report(&r, ops, 1e-3)
        })
        .await
        .unwrap()
        .into_inner();
    assert!(a.replanned, "{a:?}");
    let p4 = next_plan(&mut plans).await;
    assert_eq!(p4.version, 4);
    let st = c
        .get_status(pb::GetStatusRequest { job_id: r.job_id })
        .await
        .unwrap()
        .into_inner();
    let j = &st.jobs[0];
    assert_eq!(
        (j.base_bytes, j.base_source.as_str(), j.reported_base_bytes),
        (measured, "measured", measured)
    );
    assert_eq!(j.lower_bound_bytes, lower_bound + 1_000_000_000);

    c.unregister_job(pb::UnregisterJobRequest {
        job_id: r.job_id,
        token: r.token.clone(),
    })
    .await
    .unwrap();
    // The stream says DONE and ends.
    let last = plans.message().await.unwrap().unwrap();
    assert_eq!(last.state, pb::JobState::Done as i32);
    assert!(plans.message().await.unwrap().is_none());
    let st = status(&mut c).await;
    assert!(st.jobs.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_registers_gets_plans_reports_and_leaves_over_tcp() {
    let s = tcp(config()).await;
    register_plan_report_unregister(&s.address).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_registers_gets_plans_reports_and_leaves_over_a_unix_socket() {
    let s = unix(config()).await;
    register_plan_report_unregister(&s.address).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_job_replans_the_first_and_admission_queues_what_does_not_fit() {
    let g = mlp(256);
    let lb = {
        let live = tensile_graph::Liveness::analyze(&g);
        live.largest_working_set(&g) + config().device.base_bytes
    };
    let mut cfg = config();
    // Room for one job's smallest footprint and a half.
    cfg.budget_bytes = lb + lb / 2;
    let s = tcp(cfg).await;
    let mut c = connect(&s.address).await;
    let a = register(&mut c, "a", &g).await;
    let mut pa = subscribe(&mut c, &a).await;
    assert_eq!(next_plan(&mut pa).await.version, 1);
    let mut high = register_req("b", &g);
    high.settings = Some(pb::JobSettings {
        priority: 5,
        ..Default::default()
    });
    let b = c.register_job(high).await.unwrap().into_inner();
    assert_eq!(b.state, pb::JobState::Queued as i32);
    assert!(b.reason.contains(" MB short"), "{}", b.reason);
    let cj = register(&mut c, "c", &g).await;
    let st = c
        .get_status(pb::GetStatusRequest { job_id: cj.job_id })
        .await
        .unwrap()
        .into_inner();
    assert!(
        st.jobs[0].reason.contains("1 queued ahead"),
        "{:?}",
        st.jobs[0]
    );
    let mut pb_ = subscribe(&mut c, &b).await;
    let first = pb_.message().await.unwrap().unwrap();
    assert_eq!(first.state, pb::JobState::Queued as i32);

    // Growing the budget admits b (priority 5) before c.
    let grown = c
        .set_memory_budget(pb::SetMemoryBudgetRequest {
            budget_bytes: 2 * lb + lb / 2,
            admin_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let changed: Vec<u64> = grown.changed.iter().map(|j| j.job_id).collect();
    assert_eq!(changed, vec![b.job_id]);
    // Its fast first plan, or already the joint plan with a.
    let v = next_plan(&mut pb_).await.version;
    assert!((1..=2).contains(&v), "b's plan version {v}");
    // a is re-planned beside b.
    assert_eq!(next_plan(&mut pa).await.version, 2);
    // a leaves: c is admitted.
    c.unregister_job(pb::UnregisterJobRequest {
        job_id: a.job_id,
        token: a.token.clone(),
    })
    .await
    .unwrap();
    let mut pc = subscribe(&mut c, &cj).await;
    // Its fast first plan (version 1), or already the joint plan with b
    // that supersedes it (version 2).
    let v = next_plan(&mut pc).await.version;
    assert!((1..=2).contains(&v), "c's plan version {v}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_graph_plans_offline_and_health_answers() {
    let s = tcp(config()).await;
    let mut c = connect(&s.address).await;
    let g = mlp(128);
    let a = c
        .plan_graph(pb::PlanGraphRequest {
            graph: Some(tensile_proto::convert::graph_to_proto(&g)),
            device: Some(pb::DeviceProfile {
                name: "h100".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(a.op_latency_s.len(), g.ops().len());
    assert!(a.latency_source.iter().all(|s| s == "roofline"));
    assert!(a.plan.is_some());
    // It touched no job.
    let st = status(&mut c).await;
    assert!(st.jobs.is_empty());

    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", s.address))
        .unwrap()
        .connect()
        .await
        .unwrap();
    assert_serving(ch).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_on_loopback_and_count_what_happened() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = config();
    cfg.metrics_listen = Some(format!("127.0.0.1:{port}").parse().unwrap());
    let s = tcp(cfg).await;
    let mut c = connect(&s.address).await;
    let g = mlp(64);
    let r = register(&mut c, "m", &g).await;
    let mut plans = subscribe(&mut c, &r).await;
    next_plan(&mut plans).await;
    c.report_latencies(report(&r, g.ops().len(), 1e-3))
        .await
        .unwrap();
    next_plan(&mut plans).await;
    let body = scrape(port).await;
    assert!(body.contains("tensile_scheduler_reports_total 1"), "{body}");
    assert!(
        body.contains("tensile_scheduler_replans_total{reason=\"first_measurements\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("tensile_scheduler_jobs{state=\"active\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("tensile_scheduler_planning_seconds_count 2"),
        "{body}"
    );
    // The single device's series carry no gpu label, nor an empty label set.
    let samples = metric_samples(&body);
    assert!(samples.len() > 20, "{body}");
    assert!(
        samples
            .iter()
            .all(|l| !l.contains("gpu=") && !l.contains("{}")),
        "{body}"
    );
    s.stop().await;
}
