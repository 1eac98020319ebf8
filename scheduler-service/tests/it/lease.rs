//! Leases, in paused tokio time: a job whose subscriber vanished is removed
//! once its lease lapses, and the others are re-planned; so is a hung one
//! (its plan stream open, but no reports or heartbeats): an open stream
//! does not hold the lease. A hung job taking turns loses its turn with
//! its lease: the others are re-planned in turns without it, and the
//! status says they take turns and why.

use std::time::Duration;

use tensile_proto::pb;

use crate::util::*;

#[tokio::test(start_paused = true)]
async fn a_vanished_subscriber_lapses_and_the_others_are_replanned() {
    let s = unix(config()).await;
    let mut c = connect(&s.address).await;
    let g = mlp(128);
    let a = register(&mut c, "stays", &g).await;
    let b = register(&mut c, "vanishes", &g).await;
    let mut pa = subscribe(&mut c, &a).await;
    let v = next_plan(&mut pa).await.version;
    {
        let mut other = connect(&s.address).await;
        let mut pb_ = subscribe(&mut other, &b).await;
        next_plan(&mut pb_).await;
        // The worker goes: its connection and stream with it.
    }
    let beat = |c: &mut Client| {
        let mut c = c.clone();
        let (id, token) = (a.job_id, a.token.clone());
        async move {
            c.heartbeat(pb::HeartbeatRequest { job_id: id, token })
                .await
                .unwrap();
        }
    };
    // Within the lease nothing happens...
    tokio::time::sleep(Duration::from_secs(5)).await;
    beat(&mut c).await;
    let st = status(&mut c).await;
    assert_eq!(st.jobs.len(), 2);
    // ...past it, b is gone and a is re-planned alone; a's heartbeats kept
    // its lease.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_secs(6)).await;
        beat(&mut c).await;
    }
    let st = status(&mut c).await;
    let ids: Vec<u64> = st.jobs.iter().map(|j| j.job_id).collect();
    assert_eq!(ids, vec![a.job_id]);
    let mut last = v;
    while last == v {
        last = next_plan(&mut pa).await.version;
    }
    assert!(last > v);
    let e = c
        .heartbeat(pb::HeartbeatRequest {
            job_id: b.job_id,
            token: b.token.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn heartbeats_keep_a_job_without_a_stream() {
    let s = tcp(config()).await;
    let mut c = connect(&s.address).await;
    let r = register(&mut c, "beats", &mlp(64)).await;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(6)).await;
        c.heartbeat(pb::HeartbeatRequest {
            job_id: r.job_id,
            token: r.token.clone(),
        })
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(11)).await;
    let st = status(&mut c).await;
    assert!(st.jobs.is_empty());
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_hung_subscriber_lapses_though_its_stream_is_open() {
    let s = unix(config()).await;
    let mut c = connect(&s.address).await;
    let g = mlp(128);
    let a = register(&mut c, "hangs", &g).await;
    let mut pa = subscribe(&mut c, &a).await;
    next_plan(&mut pa).await;
    // The worker hangs: its stream stays open, nothing else comes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let st = status(&mut c).await;
    assert_eq!(st.jobs.len(), 1, "removed within its lease");
    tokio::time::sleep(Duration::from_secs(11)).await;
    let st = status(&mut c).await;
    assert!(st.jobs.is_empty(), "still there past its lease: {st:?}");
    // Its stream says why and ends.
    let mut last = None;
    while let Some(u) = pa.message().await.unwrap() {
        last = Some(u.state);
    }
    assert_eq!(last, Some(pb::JobState::Done as i32));
    s.stop().await;
}

/// The status' layout.
async fn layout(c: &mut Client) -> (String, String) {
    let st = status(c).await;
    let m = st.memory.unwrap_or_default();
    (m.layout, m.layout_note)
}

/// A plan with a gate (the joint plan, after each job's fast one).
async fn gated_plan(s: &mut tonic::Streaming<pb::PlanUpdate>) -> pb::Plan {
    loop {
        let p = next_plan(s).await;
        if p.gate.is_some() {
            return p;
        }
    }
}

/// `job`'s gated plan once the status lists exactly the jobs `ids`, each
/// with a gate, and says `job` has that plan: not an earlier plan still in
/// the stream (of fewer jobs, registered before the others). Waits at most
/// 5 s, in steps that leave every lease alive.
async fn plan_of(
    c: &mut Client,
    s: &mut tonic::Streaming<pb::PlanUpdate>,
    job: u64,
    ids: &[u64],
) -> pb::Plan {
    let mut p = gated_plan(s).await;
    for _ in 0..50 {
        let st = status(c).await;
        let listed: Vec<u64> = st.jobs.iter().map(|j| j.job_id).collect();
        let version = st
            .jobs
            .iter()
            .find(|j| j.job_id == job)
            .map_or(0, |j| j.plan_version);
        if version > p.version {
            p = gated_plan(s).await;
        } else if listed == ids && st.jobs.iter().all(|j| j.gate.is_some()) {
            return p;
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    panic!(
        "job {job} has no plan of jobs {ids:?} after 5 s (last: version {})",
        p.version
    );
}

#[tokio::test(start_paused = true)]
async fn a_hung_job_taking_turns_loses_its_turn_with_its_lease() {
    // Sharing slows each of k jobs 1 + 3 (k - 1) times: three jobs take
    // turns, and so do two.
    let mut config = config();
    config.device.sharing_slowdown = 3.0;
    let s = unix(config).await;
    let mut c = connect(&s.address).await;
    let g = mlp(128);
    let a = register(&mut c, "a", &g).await;
    let b = register(&mut c, "hangs", &g).await;
    let d = register(&mut c, "d", &g).await;
    let mut pa = subscribe(&mut c, &a).await;
    let mut pb_ = subscribe(&mut c, &b).await;
    let mut pd = subscribe(&mut c, &d).await;
    let three = plan_of(&mut c, &mut pa, a.job_id, &[a.job_id, b.job_id, d.job_id]).await;
    let (shown, why) = layout(&mut c).await;
    assert_eq!(shown, "turns", "{why}");
    assert!(why.starts_with("turns: predicted cycle sharing"), "{why}");
    gated_plan(&mut pb_).await;
    gated_plan(&mut pd).await;
    // `a` and `d` keep their leases; `b` hangs, its stream open.
    let beat = |c: &mut Client, r: &pb::RegisterJobResponse| {
        let mut c = c.clone();
        let (id, token) = (r.job_id, r.token.clone());
        async move {
            c.heartbeat(pb::HeartbeatRequest { job_id: id, token })
                .await
                .unwrap();
        }
    };
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(6)).await;
        beat(&mut c, &a).await;
        beat(&mut c, &d).await;
    }
    let st = status(&mut c).await;
    let ids: Vec<u64> = st.jobs.iter().map(|j| j.job_id).collect();
    assert_eq!(ids, vec![a.job_id, d.job_id]);
    // The others are re-planned without it: two turns of one cycle, one
    // job at a time, and the status still says turns. (Not a shorter
    // cycle: from predictions, taken as latencies beside the k - 1 others,
    // two jobs' turns are 7/6 of three's at this slowdown; see
    // `MeasuredIn::Sharing`.)
    let two = plan_of(&mut c, &mut pa, a.job_id, &[a.job_id, d.job_id]).await;
    let other = plan_of(&mut c, &mut pd, d.job_id, &[a.job_id, d.job_id]).await;
    assert!(two.version > three.version);
    let (ga, gd) = (two.gate.unwrap(), other.gate.unwrap());
    assert_eq!(ga.period_ns, gd.period_ns);
    assert_ne!(ga.phase_ns, gd.phase_ns, "{ga:?} {gd:?}");
    assert_ne!(ga.period_ns, three.gate.unwrap().period_ns);
    let (shown, why) = layout(&mut c).await;
    assert_eq!(shown, "turns", "{why}");
    s.stop().await;
}
