//! The raw PJRT calls of a deviceless compile, over `pjrt-sys`'s bindings.
//!
//! Current plugins refuse the 0.54 size of a few argument structs (libtpu 0.0.42.1, API
//! 0.112: `PJRT_Executable_GetCompiledMemoryStats`, `PJRT_Client_Create`,
//! `PJRT_ExecuteOptions`; XLA's CPU plugin, 0.115, the same): those are declared here with
//! the fields appended since (zero = their defaults). Calls: plugin load and initialize,
//! topology, deviceless compile, memory stats, serialize; client, compile, buffers,
//! execute, events; errors.
//! Every `unsafe` block is a call through libtpu's function table with an argument struct
//! built here, or a read of memory libtpu returned for the length it gave.
#![allow(unsafe_code)]

use pjrt_sys as sys;
use std::path::Path;
use std::ptr;

/// A serialized `CompileOptionsProto` for one replica and one partition (a single-device
/// program); an empty one fails ("Number of replicas (0) must be at least 1").
pub fn single_device_options() -> Vec<u8> {
    partitioned_options(1)
}

/// A serialized `CompileOptionsProto` for one replica of `partitions` SPMD partitions on the
/// topology's first `partitions` devices with the Shardy partitioner, as JAX compiles a
/// `shard_map`ped program (one
/// partition: a single-device program).
pub fn partitioned_options(partitions: i64) -> Vec<u8> {
    use prost::Message;
    use sys::protos::xla::device_assignment_proto::ComputationDevice;
    use sys::protos::xla::{
        CompileOptionsProto, DeviceAssignmentProto, ExecutableBuildOptionsProto,
    };
    let mut build = ExecutableBuildOptionsProto {
        device_ordinal: -1,
        num_replicas: 1,
        num_partitions: partitions,
        ..Default::default()
    };
    if partitions > 1 {
        build.use_spmd_partitioning = true;
        // The program is lowered for Shardy (`sdy.manual_computation`), as JAX lowers it.
        build.use_shardy_partitioner = true;
        build.device_assignment = Some(DeviceAssignmentProto {
            replica_count: 1,
            computation_count: partitions as i32,
            computation_devices: (0..partitions)
                .map(|d| ComputationDevice { replica_device_ids: vec![d] })
                .collect(),
        });
    }
    CompileOptionsProto { executable_build_options: Some(build), ..Default::default() }
        .encode_to_vec()
}

/// A loaded and initialized PJRT plugin: its function table, and the library kept open.
pub struct Plugin {
    api: *const sys::PJRT_Api,
    _lib: libloading::Library,
}

/// Call the table entry `$f` with `$args`; a PJRT error becomes its message.
macro_rules! call {
    ($plugin:expr, $f:ident, $args:expr) => {{
        let f =
            unsafe { (*$plugin.api).$f }.ok_or(concat!("the plugin has no ", stringify!($f)))?;
        // SAFETY: `$args` is a fully initialized argument struct of `$f` with its
        // `struct_size` set; pointers in it outlive the call.
        let err = unsafe { f($args) };
        $plugin.check(err, stringify!($f))?
    }};
}

/// `Drop` for a handle that owns `self.ptr`: its PJRT `*_Destroy` call. A failed destroy
/// is ignored: a destructor has no one to report it to.
macro_rules! destroy_on_drop {
    ($ty:ty, |$s:ident| $plugin:expr, $args:ident . $field:ident, $f:ident) => {
        impl Drop for $ty {
            fn drop(&mut self) {
                let $s = &*self;
                let mut args = sys::$args::new();
                args.$field = $s.ptr;
                let _ = (|| {
                    call!($plugin, $f, &mut args);
                    Ok::<(), String>(())
                })();
            }
        }
    };
}

/// A `PJRT_Program` of MLIR text or bytecode; it borrows `program`'s bytes.
fn mlir_program(program: &[u8]) -> sys::PJRT_Program {
    const FORMAT: &[u8] = b"mlir";
    let mut prog = sys::PJRT_Program::new();
    prog.code = program.as_ptr() as *mut _;
    prog.code_size = program.len();
    prog.format = FORMAT.as_ptr() as *const _;
    prog.format_size = FORMAT.len();
    prog
}

impl Plugin {
    /// `dlopen` the plugin, `GetPjrtApi`, `PJRT_Plugin_Initialize`.
    pub fn load(path: &Path) -> Result<Plugin, String> {
        let plugin = Plugin::open(path)?;
        let mut args = sys::PJRT_Plugin_Initialize_Args::new();
        call!(plugin, PJRT_Plugin_Initialize, &mut args);
        Ok(plugin)
    }

    /// `dlopen` a plugin that this process has already initialized, and `GetPjrtApi`.
    pub fn open(path: &Path) -> Result<Plugin, String> {
        // SAFETY: loading a PJRT plugin runs its initializers; that is what it is for.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get: libloading::Symbol<unsafe extern "C" fn() -> *const sys::PJRT_Api> =
            unsafe { lib.get(b"GetPjrtApi") }
                .map_err(|e| format!("{} exports no GetPjrtApi: {e}", path.display()))?;
        // SAFETY: returns a pointer to the plugin's static function table.
        let api = unsafe { get() };
        if api.is_null() {
            return Err(format!("{}: GetPjrtApi returned null", path.display()));
        }
        Ok(Plugin { api, _lib: lib })
    }

    /// `PJRT_Client_Create` with no options, the 0.59+ struct (`kv_try_get_*` appended:
    /// current plugins refuse the shorter one). The caller owns the client.
    pub fn create_client(&self) -> Result<*mut sys::PJRT_Client, String> {
        let mut args = ClientCreateArgs {
            struct_size: std::mem::size_of::<ClientCreateArgs>(),
            extension_start: ptr::null_mut(),
            create_options: ptr::null(),
            num_options: 0,
            kv_get_callback: ptr::null_mut(),
            kv_get_user_arg: ptr::null_mut(),
            kv_put_callback: ptr::null_mut(),
            kv_put_user_arg: ptr::null_mut(),
            client: ptr::null_mut(),
            kv_try_get_callback: ptr::null_mut(),
            kv_try_get_user_arg: ptr::null_mut(),
        };
        let args_ptr = (&mut args as *mut ClientCreateArgs).cast::<sys::PJRT_Client_Create_Args>();
        call!(self, PJRT_Client_Create, args_ptr);
        if args.client.is_null() {
            return Err("PJRT_Client_Create returned no client".into());
        }
        Ok(args.client)
    }

    /// `Ok` for a null error; else the error's message and code (and the error freed).
    fn check(&self, err: *mut sys::PJRT_Error, what: &str) -> Result<(), String> {
        if err.is_null() {
            return Ok(());
        }
        let mut m = sys::PJRT_Error_Message_Args::new();
        m.error = err;
        // SAFETY: `err` is a live error from the plugin; the message lives until it is destroyed.
        let message = unsafe {
            if let Some(f) = (*self.api).PJRT_Error_Message {
                f(&mut m);
                String::from_utf8_lossy(std::slice::from_raw_parts(
                    m.message as *const u8,
                    m.message_size,
                ))
                .into_owned()
            } else {
                "(no message)".into()
            }
        };
        let mut d = sys::PJRT_Error_Destroy_Args::new();
        d.error = err;
        // SAFETY: destroys the error once.
        unsafe {
            if let Some(f) = (*self.api).PJRT_Error_Destroy {
                f(&mut d);
            }
        }
        Err(if message.is_empty() { format!("{what} failed") } else { message })
    }

    /// `PJRT_TopologyDescription_Create(name)`.
    pub fn topology(&self, name: &str) -> Result<Topology<'_>, String> {
        let mut args = sys::PJRT_TopologyDescription_Create_Args::new();
        args.topology_name = name.as_ptr() as *const _;
        args.topology_name_size = name.len();
        call!(self, PJRT_TopologyDescription_Create, &mut args);
        Ok(Topology { plugin: self, ptr: args.topology })
    }

    /// `PJRT_Compile` of an MLIR program for `topology`, without a client.
    pub fn compile(
        &self,
        program: &[u8],
        topology: &Topology<'_>,
        options: &[u8],
    ) -> Result<Executable<'_>, String> {
        let prog = mlir_program(program);
        let mut args = sys::PJRT_Compile_Args::new();
        args.topology = topology.ptr;
        args.program = &prog;
        args.compile_options = options.as_ptr() as *const _;
        args.compile_options_size = options.len();
        call!(self, PJRT_Compile, &mut args);
        Ok(Executable { plugin: self, ptr: args.executable })
    }
}

/// `PJRT_Client_Create_Args` as of PJRT C API 0.59+.
#[repr(C)]
struct ClientCreateArgs {
    struct_size: usize,
    extension_start: *mut sys::PJRT_Extension_Base,
    create_options: *const sys::PJRT_NamedValue,
    num_options: usize,
    kv_get_callback: *mut std::ffi::c_void,
    kv_get_user_arg: *mut std::ffi::c_void,
    kv_put_callback: *mut std::ffi::c_void,
    kv_put_user_arg: *mut std::ffi::c_void,
    client: *mut sys::PJRT_Client,
    kv_try_get_callback: *mut std::ffi::c_void,
    kv_try_get_user_arg: *mut std::ffi::c_void,
}

pub struct Topology<'p> {
    plugin: &'p Plugin,
    ptr: *mut sys::PJRT_TopologyDescription,
}

destroy_on_drop!(
    Topology<'_>,
    |s| s.plugin,
    PJRT_TopologyDescription_Destroy_Args.topology,
    PJRT_TopologyDescription_Destroy
);

/// `PJRT_Executable_GetCompiledMemoryStats_Args` as of PJRT C API 0.112: the 0.54 struct
/// plus `peak_memory_in_bytes` (libtpu rejects the shorter one).
#[repr(C)]
struct MemoryStatsArgs {
    struct_size: usize,
    extension_start: *mut sys::PJRT_Extension_Base,
    executable: *mut sys::PJRT_Executable,
    generated_code_size_in_bytes: i64,
    argument_size_in_bytes: i64,
    output_size_in_bytes: i64,
    alias_size_in_bytes: i64,
    temp_size_in_bytes: i64,
    host_generated_code_size_in_bytes: i64,
    host_argument_size_in_bytes: i64,
    host_output_size_in_bytes: i64,
    host_alias_size_in_bytes: i64,
    host_temp_size_in_bytes: i64,
    peak_memory_in_bytes: i64,
}

/// Device-memory figures of a compiled executable.
#[derive(Clone, Copy, Debug)]
pub struct MemoryStats {
    pub generated_code_size_in_bytes: i64,
    pub argument_size_in_bytes: i64,
    pub output_size_in_bytes: i64,
    pub alias_size_in_bytes: i64,
    pub temp_size_in_bytes: i64,
    pub peak_memory_in_bytes: i64,
}

pub struct Executable<'p> {
    plugin: &'p Plugin,
    ptr: *mut sys::PJRT_Executable,
}

impl Executable<'_> {
    pub fn memory_stats(&self) -> Result<MemoryStats, String> {
        let mut args = MemoryStatsArgs {
            struct_size: std::mem::size_of::<MemoryStatsArgs>(),
            extension_start: ptr::null_mut(),
            executable: self.ptr,
            generated_code_size_in_bytes: 0,
            argument_size_in_bytes: 0,
            output_size_in_bytes: 0,
            alias_size_in_bytes: 0,
            temp_size_in_bytes: 0,
            host_generated_code_size_in_bytes: 0,
            host_argument_size_in_bytes: 0,
            host_output_size_in_bytes: 0,
            host_alias_size_in_bytes: 0,
            host_temp_size_in_bytes: 0,
            peak_memory_in_bytes: 0,
        };
        let args_ptr = (&mut args as *mut MemoryStatsArgs)
            .cast::<sys::PJRT_Executable_GetCompiledMemoryStats_Args>();
        call!(self.plugin, PJRT_Executable_GetCompiledMemoryStats, args_ptr);
        Ok(MemoryStats {
            generated_code_size_in_bytes: args.generated_code_size_in_bytes,
            argument_size_in_bytes: args.argument_size_in_bytes,
            output_size_in_bytes: args.output_size_in_bytes,
            alias_size_in_bytes: args.alias_size_in_bytes,
            temp_size_in_bytes: args.temp_size_in_bytes,
            peak_memory_in_bytes: args.peak_memory_in_bytes,
        })
    }

    /// `PJRT_Executable_Serialize`: the bytes, copied out (and libtpu's copy freed).
    pub fn serialize(&self) -> Result<Vec<u8>, String> {
        let mut args = sys::PJRT_Executable_Serialize_Args::new();
        args.executable = self.ptr;
        call!(self.plugin, PJRT_Executable_Serialize, &mut args);
        // SAFETY: libtpu returned `serialized_bytes_size` bytes, alive until the deleter runs.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                args.serialized_bytes as *const u8,
                args.serialized_bytes_size,
            )
        }
        .to_vec();
        if let Some(deleter) = args.serialized_executable_deleter {
            // SAFETY: called once, on the object libtpu gave with it.
            unsafe { deleter(args.serialized_executable) };
        }
        Ok(bytes)
    }
}

destroy_on_drop!(
    Executable<'_>,
    |s| s.plugin,
    PJRT_Executable_Destroy_Args.executable,
    PJRT_Executable_Destroy
);

// --- execution --------------------------------------------------------------------------------

/// `PJRT_ExecuteOptions` as current plugins want it: the 0.54 fields, then five fields
/// appended since (all zero/null = their defaults).
#[repr(C)]
struct ExecuteOptions {
    base: sys::PJRT_ExecuteOptions,
    appended: [u64; 5],
}

/// A PJRT client (the plugin kept alive with it).
pub struct Client {
    plugin: std::rc::Rc<Plugin>,
    ptr: *mut sys::PJRT_Client,
}

impl Client {
    pub fn create(plugin: std::rc::Rc<Plugin>) -> Result<Client, String> {
        let ptr = plugin.create_client()?;
        Ok(Client { plugin, ptr })
    }

    pub fn platform(&self) -> Result<String, String> {
        let mut args = sys::PJRT_Client_PlatformName_Args::new();
        args.client = self.ptr;
        call!(self.plugin, PJRT_Client_PlatformName, &mut args);
        // SAFETY: the name lives as long as the client.
        Ok(String::from_utf8_lossy(unsafe {
            std::slice::from_raw_parts(args.platform_name as *const u8, args.platform_name_size)
        })
        .into_owned())
    }

    fn first_device(&self) -> Result<*mut sys::PJRT_Device, String> {
        let mut args = sys::PJRT_Client_AddressableDevices_Args::new();
        args.client = self.ptr;
        call!(self.plugin, PJRT_Client_AddressableDevices, &mut args);
        if args.num_addressable_devices == 0 {
            return Err("the client has no addressable device".into());
        }
        // SAFETY: libtpu returned `num_addressable_devices` (> 0) device pointers.
        Ok(unsafe { *args.addressable_devices })
    }

    /// `PJRT_Client_Compile` of an MLIR program (one replica, one partition).
    pub fn compile(
        self: &std::rc::Rc<Self>,
        program: &[u8],
        options: &[u8],
    ) -> Result<LoadedExecutable, String> {
        let prog = mlir_program(program);
        let mut args = sys::PJRT_Client_Compile_Args::new();
        args.client = self.ptr;
        args.program = &prog;
        args.compile_options = options.as_ptr() as *const _;
        args.compile_options_size = options.len();
        call!(self.plugin, PJRT_Client_Compile, &mut args);
        Ok(LoadedExecutable { client: self.clone(), ptr: args.executable })
    }

    /// A device buffer holding a copy of `data` (row-major) on the first device.
    pub fn buffer(
        &self,
        data: &[u8],
        ty: sys::PJRT_Buffer_Type,
        dims: &[i64],
    ) -> Result<Buffer<'_>, String> {
        let mut args = sys::PJRT_Client_BufferFromHostBuffer_Args::new();
        args.client = self.ptr;
        args.data = data.as_ptr() as *const _;
        args.type_ = ty;
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        args.host_buffer_semantics =
            sys::PJRT_HostBufferSemantics_PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
        args.device = self.first_device()?;
        call!(self.plugin, PJRT_Client_BufferFromHostBuffer, &mut args);
        let buffer = Buffer { client: self, ptr: args.buffer };
        self.wait(args.done_with_host_buffer)?;
        Ok(buffer)
    }

    /// Await and destroy `event` (null: nothing to wait for).
    fn wait(&self, event: *mut sys::PJRT_Event) -> Result<(), String> {
        if event.is_null() {
            return Ok(());
        }
        let mut args = sys::PJRT_Event_Await_Args::new();
        args.event = event;
        let awaited = (|| {
            call!(self.plugin, PJRT_Event_Await, &mut args);
            Ok::<(), String>(())
        })();
        let mut d = sys::PJRT_Event_Destroy_Args::new();
        d.event = event;
        let _ = (|| {
            call!(self.plugin, PJRT_Event_Destroy, &mut d);
            Ok::<(), String>(())
        })();
        awaited
    }
}

destroy_on_drop!(Client, |s| s.plugin, PJRT_Client_Destroy_Args.client, PJRT_Client_Destroy);

pub struct LoadedExecutable {
    client: std::rc::Rc<Client>,
    ptr: *mut sys::PJRT_LoadedExecutable,
}

impl LoadedExecutable {
    /// `PJRT_Executable_NumOutputs` of the compiled program.
    pub fn num_outputs(&self) -> Result<usize, String> {
        let plugin = &self.client.plugin;
        let mut g = sys::PJRT_LoadedExecutable_GetExecutable_Args::new();
        g.loaded_executable = self.ptr;
        call!(plugin, PJRT_LoadedExecutable_GetExecutable, &mut g);
        let exe = Executable { plugin, ptr: g.executable };
        let mut args = sys::PJRT_Executable_NumOutputs_Args::new();
        args.executable = exe.ptr;
        call!(plugin, PJRT_Executable_NumOutputs, &mut args);
        Ok(args.num_outputs)
    }

    /// Execute on the first device. Every input is donatable: those the program aliases to
    /// outputs are donated (and deleted).
    pub fn execute<'c>(&'c self, inputs: &[&Buffer<'c>]) -> Result<Vec<Buffer<'c>>, String> {
        let n = self.num_outputs()?;
        let mut options =
            ExecuteOptions { base: sys::PJRT_ExecuteOptions::new(), appended: [0; 5] };
        options.base.struct_size = std::mem::size_of::<ExecuteOptions>();
        let args_list: Vec<*mut sys::PJRT_Buffer> = inputs.iter().map(|b| b.ptr).collect();
        let arg_lists: [*const *mut sys::PJRT_Buffer; 1] = [args_list.as_ptr()];
        let mut outs: Vec<*mut sys::PJRT_Buffer> = vec![ptr::null_mut(); n];
        let out_lists: [*mut *mut sys::PJRT_Buffer; 1] = [outs.as_mut_ptr()];
        let mut events: [*mut sys::PJRT_Event; 1] = [ptr::null_mut()];
        let mut args = sys::PJRT_LoadedExecutable_Execute_Args::new();
        args.executable = self.ptr;
        args.options = (&mut options as *mut ExecuteOptions).cast();
        args.argument_lists = arg_lists.as_ptr();
        args.num_devices = 1;
        args.num_args = inputs.len();
        args.output_lists = out_lists.as_ptr();
        args.device_complete_events = events.as_mut_ptr();
        call!(self.client.plugin, PJRT_LoadedExecutable_Execute, &mut args);
        let outputs: Vec<Buffer<'c>> =
            outs.into_iter().map(|ptr| Buffer { client: &self.client, ptr }).collect();
        self.client.wait(events[0])?;
        Ok(outputs)
    }
}

destroy_on_drop!(
    LoadedExecutable,
    |s| s.client.plugin,
    PJRT_LoadedExecutable_Destroy_Args.executable,
    PJRT_LoadedExecutable_Destroy
);

pub struct Buffer<'c> {
    client: &'c Client,
    ptr: *mut sys::PJRT_Buffer,
}

impl Buffer<'_> {
    /// Whether the buffer was deleted (donated to an output).
    pub fn is_deleted(&self) -> Result<bool, String> {
        let mut args = sys::PJRT_Buffer_IsDeleted_Args::new();
        args.buffer = self.ptr;
        call!(self.client.plugin, PJRT_Buffer_IsDeleted, &mut args);
        Ok(args.is_deleted)
    }

    /// The contents, row-major.
    pub fn to_host(&self) -> Result<Vec<u8>, String> {
        let mut args = sys::PJRT_Buffer_ToHostBuffer_Args::new();
        args.src = self.ptr;
        call!(self.client.plugin, PJRT_Buffer_ToHostBuffer, &mut args);
        let mut data = vec![0u8; args.dst_size];
        let mut args2 = sys::PJRT_Buffer_ToHostBuffer_Args::new();
        args2.src = self.ptr;
        args2.dst = data.as_mut_ptr() as *mut _;
        args2.dst_size = data.len();
        call!(self.client.plugin, PJRT_Buffer_ToHostBuffer, &mut args2);
        self.client.wait(args2.event)?;
        Ok(data)
    }
}

destroy_on_drop!(
    Buffer<'_>,
    |s| s.client.plugin,
    PJRT_Buffer_Destroy_Args.buffer,
    PJRT_Buffer_Destroy
);
