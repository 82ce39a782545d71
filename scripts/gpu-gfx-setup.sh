# Sourced on a GPU machine, from the repository root, before the render and video
# workloads (scripts/gpu-run.sh render): unpacks the GL/EGL/Vulkan loader packages of .gl/
# (libglvnd, libvulkan1: Debian's, fetched with apt-get download) and installs the wheels of
# .whlgfx/ (moderngl, glcontext, wgpu, rendercanvas, PyNvVideoCodec) into /tmp/site, then
# points the Vulkan and EGL loaders at the driver's own ICD files.
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whlgfx/*.whl ||
	return 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
for d in /usr/local/nvidia/share /usr/share /etc; do
	[[ -z ${VK_DRIVER_FILES:-} && -f $d/vulkan/icd.d/nvidia_icd.json ]] && export VK_DRIVER_FILES=$d/vulkan/icd.d/nvidia_icd.json
	[[ -z ${__EGL_VENDOR_LIBRARY_FILENAMES:-} && -f $d/glvnd/egl_vendor.d/10_nvidia.json ]] &&
		export __EGL_VENDOR_LIBRARY_FILENAMES=$d/glvnd/egl_vendor.d/10_nvidia.json
done
echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-} __EGL_VENDOR_LIBRARY_FILENAMES=${__EGL_VENDOR_LIBRARY_FILENAMES:-}"
ldconfig -p | grep -E 'libvulkan|libEGL|libnvcuvid|libnvidia-encode|libnvjpeg'
