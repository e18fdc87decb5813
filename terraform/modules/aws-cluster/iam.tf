# One instance role for every node: SSM Session Manager (shell access without opening
# SSH), and reading the TLS key's SSM parameter when tls.key_ssm_parameter is set (with
# the default aws/ssm KMS key; a customer-managed key also needs kms:Decrypt).

resource "aws_iam_role" "node" {
  name_prefix = "${var.cluster_name}-node-"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Action    = "sts:AssumeRole"
      Principal = { Service = "ec2.amazonaws.com" }
    }]
  })
  tags = local.common_tags
}

resource "aws_iam_role_policy_attachment" "ssm_core" {
  role       = aws_iam_role.node.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

data "aws_partition" "current" {}

resource "aws_iam_role_policy" "tls_key" {
  count       = local.tls_key_parameter == null ? 0 : 1
  name_prefix = "tls-key-"
  role        = aws_iam_role.node.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect   = "Allow"
      Action   = "ssm:GetParameter"
      Resource = "arn:${data.aws_partition.current.partition}:ssm:*:*:parameter/${trimprefix(local.tls_key_parameter, "/")}"
    }]
  })
}

resource "aws_iam_instance_profile" "node" {
  name_prefix = "${var.cluster_name}-node-"
  role        = aws_iam_role.node.name
  tags        = local.common_tags
}
