#!/usr/bin/env bash
# push.sh <serial> <bundle_dir> : push qhx_generate, the QNN libraries and one bundle.
# NOT VERIFIED ON HARDWARE.
source "$(dirname "$0")/common.sh"
serial=$1 bundle=$2
: "${QHX_QNN_LIBS:?set QHX_QNN_LIBS to the directory with the QNN runtime libraries}"
adb -s "$serial" shell "mkdir -p $REMOTE/bundle"
adb -s "$serial" push "$BIN" "$REMOTE/qhx_generate" >&2
adb -s "$serial" shell "chmod 755 $REMOTE/qhx_generate"
for f in "$QHX_QNN_LIBS"/libQnnHtp.so "$QHX_QNN_LIBS"/libQnnSystem.so "$QHX_QNN_LIBS"/libQnnHtpV*Stub.so "$QHX_QNN_LIBS"/libQnnHtpV*Skel.so; do
    [[ -f "$f" ]] && adb -s "$serial" push "$f" "$REMOTE/" >&2
done
adb -s "$serial" push "$bundle/." "$REMOTE/bundle/" >&2
echo "$serial: pushed to $REMOTE" >&2
