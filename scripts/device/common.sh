# Shared settings for the adb scripts. NOT VERIFIED ON HARDWARE: written against the
# documented QNN / Android layout; no device was available when they were written.
#   QHX_DEVICE_DIR   remote working dir (default /data/local/tmp/qhx)
#   QHX_QNN_LIBS     local dir holding libQnnHtp.so libQnnSystem.so libQnnHtpV*Stub.so
#                    libQnnHtpV*Skel.so (from the QAIRT SDK: lib/aarch64-android and
#                    lib/hexagon-v*/unsigned)
#   QHX_BIN          local qhx_generate (default target/aarch64-linux-android/release/qhx_generate)
#   ANDROID_SERIALS  space-separated serials for the multi-device scripts (default: all
#                    devices `adb devices` lists)
set -euo pipefail
REMOTE=${QHX_DEVICE_DIR:-/data/local/tmp/qhx}
BIN=${QHX_BIN:-target/aarch64-linux-android/release/qhx_generate}
serials() {
    if [[ -n "${ANDROID_SERIALS:-}" ]]; then
        echo "$ANDROID_SERIALS"
    else
        adb devices | awk 'NR > 1 && $2 == "device" {print $1}'
    fi
}
# The DSP loads the skel from ADSP_LIBRARY_PATH (';'-separated); the CPU side finds
# libQnnHtp.so / libQnnSystem.so / the stub via LD_LIBRARY_PATH. libcdsprpc.so (rpcmem)
# lives in /vendor/lib64 and is found by the default linker path.
remote_env() {
    echo "cd $REMOTE && export LD_LIBRARY_PATH=$REMOTE:/vendor/lib64:\$LD_LIBRARY_PATH && export ADSP_LIBRARY_PATH='$REMOTE;/vendor/dsp/cdsp;/vendor/lib/rfsa/adsp;/system/lib/rfsa/adsp;/dsp'"
}
