//! Multi-device kernels: the mesh and collective id in the call spec and the printed IR, and
//! misuse reported at the author's line.
use palladium_dsl::ir::{PrintOptions, print_kernel};
use palladium_dsl::prelude::*;

#[kernel(mesh = [x = 2, y = n], collective_id = 0)]
fn ring_step(
    #[default(4)] n: usize,
    #[input(f32[8, 128])] x: Ref,
    #[output(f32[8, 128])] o: Ref,
    #[scratch(dma_sem)] send: SemRef,
    #[scratch(dma_sem)] recv: SemRef,
) {
    let right = (axis_index("y") + 1) % scalar(n as i32) + axis_index("x") * scalar(n as i32);
    let barrier = barrier_semaphore();
    barrier.signal_remote(1, right);
    barrier.wait(1);
    let copy = remote_copy(x, o, send, recv, right);
    copy.start();
    copy.wait();
}

#[test]
fn mesh_collective_id_and_remote_ops_print() {
    let k = ring_step::build(&ring_step::Params { n: 4 }).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(k.call.devices(), 8);
    let text = print_kernel(&k, PrintOptions::default());
    assert!(text.contains("  mesh [x=2, y=4]\n  collective_id 0\n"), "{text}");
    assert!(text.contains(" = device_id : i32"), "{text}");
    assert!(text.contains(" = barrier_semaphore : sem"), "{text}");
    // `wait` on a remote copy: the send wait (source and destination swapped, as Pallas),
    // then the receive naming the copy's device.
    assert!(
        text.contains("dma_wait v1 -> v0 sem v2 send\n  dma_wait v0 -> v1 sem v3 recv device v"),
        "{text}"
    );
}

#[kernel]
fn remote_without_mesh(
    #[input(f32[8, 128])] x: Ref,
    #[output(f32[8, 128])] o: Ref,
    #[scratch(dma_sem[2])] sems: SemRef,
) {
    let copy = remote_copy(x, o, sems.at(0), sems.at(1), 1);
    copy.start();
    copy.wait();
}

#[test]
fn a_remote_copy_needs_a_mesh() {
    let errors = remote_without_mesh::build(&Default::default()).unwrap_err();
    let text = errors.to_string();
    assert!(
        text.contains(
            "a remote DMA needs the devices of a mesh: declare it, #[kernel(mesh = [x = 4], ..)]"
        ),
        "{text}"
    );
    assert!(text.contains("a remote DMA wait needs the devices of a mesh"), "{text}");
    assert!(
        errors.0.iter().all(|e| e.loc.is_some_and(|l| l.file.ends_with("tests/multi_device.rs"))),
        "{text}"
    );
}

#[kernel(mesh = [x = 4])]
fn misused(
    #[input(f32[8, 128])] x: Ref,
    #[output(f32[8, 128])] o: Ref,
    #[scratch(dma_sem[2])] sems: SemRef,
) {
    let barrier = barrier_semaphore();
    barrier.wait(1);
    let row = axis_index("z");
    let wrong = x[..].sum_all();
    let copy = remote_copy(x, o, sems.at(0), sems.at(1), wrong);
    copy.start();
    o[..] = x[..] + row.cast(f32);
}

#[test]
fn barrier_without_collective_id_unknown_axis_and_float_device_ids_are_errors() {
    let text = misused::build(&Default::default()).unwrap_err().to_string();
    assert!(
        text.contains(
            "the barrier semaphore needs a collective id: #[kernel(collective_id = 0, ..)]"
        ),
        "{text}"
    );
    assert!(text.contains("axis_index: the mesh [x=4] has no axis `z`"), "{text}");
    assert!(text.contains("dma_start: device id must be an i32 scalar, got f32"), "{text}");
    assert_eq!(text.lines().count(), 3, "{text}");
}
